//! This process alone: a world of one, its options and queries, every
//! collective (whose reference over one rank is its own data), and errors.

mod support;

use std::time::Duration;

use concord::{CommOptions, Communicator, Error, ReduceOp, TensorRef};

use support::collectives::{check_all, LENGTHS};

fn alone() -> Communicator {
    Communicator::init_with(&CommOptions { rank: Some(0), world_size: Some(1),
                                           ..Default::default() }).unwrap()
}

#[test]
fn alone_a_process_is_a_world_of_one() {
    let comm = Communicator::init().unwrap();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
    assert_eq!(comm.local_rank().unwrap(), 0);
    assert_eq!(comm.backend().unwrap(), "shm");
    assert!(comm.timeout().unwrap() > Duration::ZERO);
}

#[test]
fn options_take_the_place_of_the_environment() {
    let comm = Communicator::init_with(&CommOptions {
        rank: Some(0),
        world_size: Some(1),
        timeout: Some(Duration::from_millis(7250)),
        backend: Some("shm".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(comm.timeout().unwrap(), Duration::from_millis(7250));
    assert_eq!(comm.backend().unwrap(), "shm");
}

#[test]
fn bad_options_are_refused_before_any_rendezvous() {
    let outside = Communicator::init_with(&CommOptions { rank: Some(3), world_size: Some(2),
                                                         ..Default::default() });
    match outside {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("rank 3 outside [0, 2)"),
                                                        "{message}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let nul = Communicator::init_with(&CommOptions { backend: Some("s\0hm".into()),
                                                     ..Default::default() });
    assert!(matches!(nul, Err(Error::InvalidArgument(ref m)) if m.contains("backend")), "{nul:?}");
    let backend = Communicator::init_with(&CommOptions { rank: Some(0), world_size: Some(1),
                                                         backend: Some("carrier pigeon".into()),
                                                         ..Default::default() });
    assert!(matches!(backend, Err(Error::InvalidArgument(ref m)) if m.contains("carrier pigeon")),
            "{backend:?}");
}

#[test]
fn every_collective_on_a_world_of_one() {
    let comm = alone();
    let seed = support::seed();
    check_all(&comm, seed, &LENGTHS).assert_none(seed);
}

#[test]
fn errors_carry_the_status_and_the_librarys_message() {
    let comm = alone();
    let send = [1.0f32, 2.0, 3.0];
    let mut recv = [0.0f32; 4];
    let error = comm.all_reduce_into(&send, &mut recv, ReduceOp::Sum).unwrap_err();
    assert_eq!(error, Error::InvalidArgument(
        "all_reduce: recv holds 4 elements, send holds 3".to_string()));
    assert_eq!(error.status(), concord::sys::CONCORD_ERR_INVALID_ARGUMENT);
    assert_eq!(error.to_string(), "invalid argument: all_reduce: recv holds 4 elements, send holds 3");

    let error = comm.broadcast(&mut recv, 1).unwrap_err();
    assert!(error.message().contains("root 1 is outside [0, 1)"), "{error}");
    let error = comm.all_gather(&send, &mut recv).unwrap_err();
    assert!(error.message().contains("recv holds 4 elements, expected 1 x 3"), "{error}");
    let mut flags = [true, false];
    let error = comm.all_reduce(&mut flags, ReduceOp::Sum).unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)) && error.message().contains("bool"),
            "{error}");
    assert_eq!(flags, [true, false], "a refused collective leaves its buffer alone");
}

/// The library keeps one last-error text per OS thread; each error is read
/// right after its call, so threads failing at once each get their own.
#[test]
fn each_thread_gets_its_own_error_text() {
    std::thread::scope(|scope| {
        for length in 1..=4usize {
            scope.spawn(move || {
                let comm = alone();
                let send = vec![0i32; length];
                let mut recv = vec![0i32; length + 1];
                for _ in 0..200 {
                    let error = comm.all_reduce_into(&send, &mut recv, ReduceOp::Max).unwrap_err();
                    let expected = format!("all_reduce: recv holds {} elements, send holds {length}",
                                           length + 1);
                    assert_eq!(error.message(), expected);
                }
            });
        }
    });
}

#[test]
fn split_of_a_world_of_one() {
    let world = alone();
    assert!(world.split(None, 0).unwrap().is_none());
    let child = world.split(Some(5), 0).unwrap().expect("color 5 has this rank");
    assert_eq!((child.rank(), child.size()), (0, 1));
    // The child keeps what it needs of its parent.
    drop(world);
    let mut x = [4i64, -2];
    child.all_reduce(&mut x, ReduceOp::Mean).unwrap();
    assert_eq!(x, [4, -2]);
}

#[test]
fn work_can_be_tested_and_waited_for_with_a_limit() {
    let comm = alone();
    let mut x = vec![1.5f64; 10_007];
    let mut work = comm.all_reduce_async(&mut x, ReduceOp::Sum).unwrap();
    let mut done = false;
    for _ in 0..1000 {
        if work.wait_timeout(Duration::from_millis(10)).unwrap() {
            done = true;
            break;
        }
    }
    assert!(done);
    assert!(work.test().unwrap(), "a finished work stays finished");
    drop(work);
    assert!(x.iter().all(|&v| v == 1.5));
}

#[test]
fn views_check_their_shape() {
    let data = [1u8, 2, 3, 4, 5, 6];
    let view = TensorRef::new(&data, &[2, 3]).unwrap();
    assert_eq!(view.shape(), &[2, 3]);
    assert_eq!(view.dtype(), concord::DType::U8);
    let error = TensorRef::new(&data, &[4, 2]).unwrap_err();
    assert_eq!(error.message(), "a slice of 6 elements cannot have shape [4, 2] (8 elements)");
    assert_eq!(TensorRef::new(&data[..1], &[]).unwrap().shape(), &[] as &[i64]);
}

#[test]
fn the_library_reports_its_version_and_build() {
    assert_eq!(concord::version(), env!("CARGO_PKG_VERSION"));
    let info = concord::build_info();
    assert!(info.starts_with('{') && info.contains("\"version\""), "{info}");
}
