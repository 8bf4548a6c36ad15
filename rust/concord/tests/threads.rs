//! Ranks as threads of this process meeting through a store: the store's
//! own calls, failures that involve several ranks (disagreement, abort,
//! interruption, waiting with a limit), multi-tensor all-reduce and
//! gradient buckets, each checked against a reference.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use concord::{Communicator, Compression, DType, Error, GradSync, GradSyncOptions, Layout,
              ReduceOp, Store, StoreServer, TensorMut};

use support::{rank_data, reference, thread_ranks};

#[test]
fn a_store_sets_gets_adds_waits_and_deletes() {
    let server = StoreServer::new("127.0.0.1", 0, "secret").unwrap();
    let port = server.port().unwrap();
    assert!(port > 0);
    let timeout = Duration::from_secs(10);
    let mut writer = Store::connect("127.0.0.1", port, "secret", timeout).unwrap();
    let mut reader = Store::connect("127.0.0.1", port, "secret", timeout).unwrap();
    // Larger than the first buffer get() tries.
    let large: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    writer.set("large", &large).unwrap();
    writer.set("empty", b"").unwrap();
    reader.wait(&["large", "empty"], timeout).unwrap();
    assert_eq!(reader.get("large", timeout).unwrap(), large);
    assert_eq!(reader.get("empty", timeout).unwrap(), b"");
    assert_eq!(writer.add("counter", 5).unwrap(), 5);
    assert_eq!(reader.add("counter", -2).unwrap(), 3);
    assert!(writer.delete("large").unwrap());
    assert!(!writer.delete("large").unwrap());
    let missing = reader.get("large", Duration::from_millis(100)).unwrap_err();
    assert!(matches!(missing, Error::Timeout(_)), "{missing}");

    let stranger = Store::connect("127.0.0.1", port, "wrong", Duration::from_millis(500))
        .and_then(|mut store| store.set("x", b"1"));
    assert!(stranger.is_err(), "a client without the token is refused");
    assert!(matches!(StoreServer::new("127.0.0.1", 0, ""), Err(Error::InvalidArgument(_))));
}

#[test]
fn ranks_that_disagree_get_a_mismatch() {
    let results = thread_ranks(2, |comm| {
        if comm.rank() == 0 {
            comm.all_reduce(&mut [1.0f32; 10], ReduceOp::Sum)
        } else {
            comm.all_reduce(&mut [1.0f64; 10], ReduceOp::Sum)
        }
    });
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(Error::Mismatch(message)) => assert!(message.contains("float"), "{message}"),
            other => panic!("rank {rank}: expected Mismatch, got {other:?}"),
        }
    }
}

#[test]
fn an_abort_fails_the_peers() {
    let results = thread_ranks(2, |comm| {
        if comm.rank() == 0 {
            comm.abort().unwrap();
            comm.barrier()
        } else {
            comm.all_reduce(&mut [0i32; 3], ReduceOp::Sum)
        }
    });
    assert!(matches!(results[0], Err(Error::Aborted(_))), "{:?}", results[0]);
    assert!(matches!(results[1], Err(Error::Remote(ref m)) if m.contains("abort")),
            "{:?}", results[1]);
}

static STOP: AtomicBool = AtomicBool::new(false);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// A blocked collective gives up when the thread's check says so, and its
/// abort fails the peer at once.
#[test]
fn the_interrupt_check_ends_a_blocked_collective() {
    let results = thread_ranks(2, |comm| {
        if comm.rank() == 0 {
            concord::set_interrupt_check(Some(|| STOP.load(Ordering::Relaxed))).unwrap();
            // Rank 1 joins no barrier: only the check can end this one.
            let result = comm.barrier();
            concord::set_interrupt_check(None).unwrap();
            INTERRUPTED.store(true, Ordering::Release);
            result
        } else {
            std::thread::sleep(Duration::from_millis(300));
            STOP.store(true, Ordering::Relaxed);
            while !INTERRUPTED.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(10));
            }
            comm.barrier()
        }
    });
    assert!(matches!(results[0], Err(Error::Interrupted(_))), "{:?}", results[0]);
    assert!(matches!(results[1], Err(Error::Remote(_))), "{:?}", results[1]);
}

#[test]
fn a_wait_with_a_limit_reports_a_collective_still_running() {
    let results = thread_ranks(2, |comm| {
        let mut x = vec![comm.rank() as f32 + 1.0; 257];
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(400));
            comm.all_reduce(&mut x, ReduceOp::Prod).unwrap();
            return (None, x);
        }
        let mut work = comm.all_reduce_async(&mut x, ReduceOp::Prod).unwrap();
        let early = (work.wait_timeout(Duration::from_millis(20)).unwrap(),
                     work.test().unwrap());
        work.wait().unwrap();
        (Some(early), x)
    });
    assert_eq!(results[0].0, Some((false, false)), "rank 1 had not joined yet");
    for (_, x) in &results {
        assert!(x.iter().all(|&v| v == 2.0));
    }
}

/// Tensors of several dtypes and shapes all-reduced as one operation.
#[test]
fn all_reduce_multi_reduces_every_tensor() {
    let seed = support::seed();
    let n = 3;
    let results = thread_ranks(n, |comm| {
        let r = comm.rank();
        let mut a: Vec<f32> = rank_data(seed, r, 1, 12, ReduceOp::Sum);
        let mut b: Vec<i64> = rank_data(seed, r, 2, 70_001, ReduceOp::Sum);
        let mut c: Vec<f64> = rank_data(seed, r, 3, 1, ReduceOp::Sum);
        {
            let mut tensors = vec![TensorMut::new(&mut a, &[3, 4]).unwrap(),
                                   TensorMut::from(&mut b), TensorMut::new(&mut c, &[]).unwrap()];
            comm.all_reduce_multi_async(&mut tensors, ReduceOp::Sum).unwrap().wait().unwrap();
        }
        (a, b, c)
    });
    fn all<T: support::Value>(seed: u64, n: usize, case: u64, len: usize) -> Vec<Vec<T>> {
        (0..n).map(|r| rank_data(seed, r, case, len, ReduceOp::Sum)).collect()
    }
    let a: Vec<Vec<f32>> = all(seed, n, 1, 12);
    let b: Vec<Vec<i64>> = all(seed, n, 2, 70_001);
    let c: Vec<Vec<f64>> = all(seed, n, 3, 1);
    let mut checks = support::Checks::new(0);
    for (rank, (ra, rb, rc)) in results.iter().enumerate() {
        checks.expect(&format!("rank {rank} float32 [3, 4]"), ra, &reference(&a, ReduceOp::Sum));
        checks.expect(&format!("rank {rank} int64 [70001]"), rb, &reference(&b, ReduceOp::Sum));
        checks.expect(&format!("rank {rank} float64 []"), rc, &reference(&c, ReduceOp::Sum));
    }
    checks.assert_none(seed);
}

// ---- gradient buckets ---------------------------------------------------------------

/// A model's gradients: several shapes, float32 and float64, one over the
/// size the library all-reduces in place instead of packing (256 KiB).
fn mixed_layouts() -> Vec<Layout> {
    vec![Layout::of::<f32>(&[17, 3]), Layout::of::<f64>(&[5]), Layout::of::<f32>(&[70_001]),
         Layout::of::<f32>(&[]), Layout::of::<f64>(&[4, 2, 3])]
}

/// A gradient of either floating dtype.
#[derive(Clone, Debug)]
enum Grad {
    Single(Vec<f32>),
    Double(Vec<f64>),
}

impl Grad {
    fn values(&self) -> Vec<f64> {
        match self {
            Grad::Single(g) => g.iter().map(|&v| f64::from(v)).collect(),
            Grad::Double(g) => g.clone(),
        }
    }
}

/// The float32 gradients of [`mixed_layouts`]: compression applies to
/// float32 only.
fn float32_layouts() -> Vec<Layout> {
    mixed_layouts().into_iter().filter(|l| l.dtype == DType::F32).collect()
}

/// Rank `rank`'s gradients of `layouts` for step `step`.
fn gradients(layouts: &[Layout], seed: u64, rank: usize, step: u64) -> Vec<Grad> {
    layouts
        .iter()
        .enumerate()
        .map(|(i, layout)| {
            let (case, len) = (step * 100 + i as u64, layout.shape.iter().product());
            match layout.dtype {
                DType::F32 => Grad::Single(rank_data(seed, rank, case, len, ReduceOp::Sum)),
                _ => Grad::Double(rank_data(seed, rank, case, len, ReduceOp::Sum)),
            }
        })
        .collect()
}

/// Marks every gradient in backward order, waits, and returns them.
fn synchronized(sync: &mut GradSync<'_>, mut grads: Vec<Grad>) -> concord::Result<Vec<Grad>> {
    let mut step = sync.step();
    for (index, grad) in grads.iter_mut().enumerate().rev() {
        match grad {
            Grad::Single(g) => step.mark_ready(index, g.as_mut_slice())?,
            Grad::Double(g) => step.mark_ready(index, g.as_mut_slice())?,
        }
    }
    step.wait()?;
    Ok(grads)
}

/// The mean over ranks of each gradient, as the library defines it: each
/// rank adds grad / size, in the gradient's dtype.
fn reference_mean(all: &[Vec<Vec<f64>>], index: usize, dtype: DType) -> Vec<f64> {
    // all[rank][index]: the gradient values of each rank.
    let n = all.len();
    (0..all[0][index].len())
        .map(|i| match dtype {
            DType::F32 => all.iter().map(|g| g[index][i] as f32 / n as f32).sum::<f32>() as f64,
            _ => all.iter().map(|g| g[index][i] / n as f64).sum::<f64>(),
        })
        .collect()
}

/// Every rank's synchronized gradients against the mean of `sent` (every
/// rank's gradients), within `relative` times the mean of |grad|.
fn check_means(layouts: &[Layout], seed: u64, results: &[Vec<Grad>], sent: &[Vec<Grad>],
               relative: f64) {
    let values = |grads: &[Grad]| grads.iter().map(Grad::values).collect::<Vec<_>>();
    let all: Vec<Vec<Vec<f64>>> = sent.iter().map(|g| values(g)).collect();
    let all = &all;
    let mut checks = support::Checks::new(0);
    for (rank, grads) in results.iter().enumerate() {
        let grads = values(grads);
        for (index, layout) in layouts.iter().enumerate() {
            let expected = reference_mean(all, index, layout.dtype);
            let scale: Vec<f64> = (0..expected.len())
                .map(|i| all.iter().map(|g| g[index][i].abs()).sum::<f64>() / all.len() as f64)
                .collect();
            let bad = (0..expected.len())
                .filter(|&i| (grads[index][i] - expected[i]).abs() > relative * scale[i] + 1e-6)
                .count();
            checks.expect_true(&format!("rank {rank} gradient {index}: {bad} elements off"),
                               bad == 0);
        }
    }
    checks.assert_none(seed);
}

#[test]
fn gradient_buckets_average_over_ranks_step_after_step() {
    let seed = support::seed();
    let n = 3;
    let options = GradSyncOptions { bucket_cap_mb: 0.0005, first_bucket_mb: 0.0001,
                                    ..Default::default() };
    let layouts = mixed_layouts();
    let results = thread_ranks(n, |comm| {
        let mut sync = GradSync::new(&comm, &layouts, None, &options).unwrap();
        let buckets = sync.num_buckets().unwrap();
        // Filled in backward order: the last gradient is in the first bucket.
        let order: Vec<usize> = (0..layouts.len()).rev()
            .map(|i| sync.bucket_of(i).unwrap()).collect();
        let steps: Vec<Vec<Grad>> = (1..=2)
            .map(|step| synchronized(&mut sync, gradients(&layouts, seed, comm.rank(), step)).unwrap())
            .collect();
        (buckets, order, steps)
    });
    for (buckets, order, _) in &results {
        assert!(*buckets > 1, "small caps make several buckets, got {buckets}");
        assert_eq!(order[0], 0);
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
    }
    for step in 1..=2u64 {
        let sent: Vec<Vec<Grad>> = (0..n).map(|r| gradients(&layouts, seed, r, step)).collect();
        let got: Vec<Vec<Grad>> =
            results.iter().map(|(_, _, steps)| steps[step as usize - 1].clone()).collect();
        check_means(&layouts, seed, &got, &sent, 1e-6);
    }
}

#[test]
fn compressed_buckets_stay_within_their_rounding() {
    let seed = support::seed();
    let n = 2;
    let layouts = float32_layouts();
    for (compress, relative) in [(Compression::BF16, 2f64.powi(-7)), (Compression::FP16, 2f64.powi(-10))] {
        let options = GradSyncOptions { compress, ..Default::default() };
        let results = thread_ranks(n, |comm| {
            let mut sync = GradSync::new(&comm, &layouts, None, &options).unwrap();
            synchronized(&mut sync, gradients(&layouts, seed, comm.rank(), 1)).unwrap()
        });
        let sent: Vec<Vec<Grad>> = (0..n).map(|r| gradients(&layouts, seed, r, 1)).collect();
        check_means(&layouts, seed, &results, &sent, relative);
    }
}

#[test]
fn gradient_buckets_refuse_what_was_not_planned() {
    let results = thread_ranks(2, |comm| {
        // Declared before the step: it borrows what it is given until it ends.
        let mut short = vec![0.0f32; 50];
        let mut wrong_dtype = vec![0.0f64; 51];
        let mut out_of_range = vec![0.0f32; 2];
        let mut sync = GradSync::new(&comm, &mixed_layouts(), None, &GradSyncOptions::default()).unwrap();
        let mut step = sync.step();
        let errors = [step.mark_ready(0, &mut short).unwrap_err(),
                      step.mark_ready(0, &mut wrong_dtype).unwrap_err(),
                      step.mark_ready(9, &mut out_of_range).unwrap_err()];
        drop(step);
        // Nothing was marked: the plan is intact.
        (errors, sync.num_buckets().is_ok())
    });
    for (errors, intact) in results {
        assert_eq!(errors[0].message(), "GradSync::mark_ready: gradient 0 has 50 elements but was \
                                         planned with shape [17, 3] (51 elements)");
        assert!(errors[1].message().contains("float64 but was planned as float32"), "{}", errors[1]);
        assert!(errors[2].message().contains('9'), "{}", errors[2]);
        assert!(errors.iter().all(|e| matches!(e, Error::InvalidArgument(_))));
        assert!(intact);
    }
}

#[test]
fn a_step_dropped_half_marked_frees_the_plan() {
    let results = thread_ranks(2, |comm| {
        let mut sync = GradSync::new(&comm, &mixed_layouts(), None, &GradSyncOptions::default()).unwrap();
        let mut grad = vec![1.0f64; 24];
        {
            let mut step = sync.step();
            step.mark_ready(4, &mut grad).unwrap();
        }
        // The gradient is free again, and the plan is gone.
        grad[0] = 2.0;
        (sync.num_buckets(), comm.barrier())
    });
    for (buckets, barrier) in results {
        assert!(matches!(buckets, Err(Error::InvalidArgument(ref m)) if m.contains("new GradSync")),
                "{buckets:?}");
        barrier.unwrap();
    }
}

#[test]
fn ranks_planning_differently_get_a_mismatch() {
    let results = thread_ranks(2, |comm| {
        let mut plan = mixed_layouts();
        if comm.rank() == 1 {
            plan[1] = Layout::of::<f64>(&[6]);
        }
        GradSync::new(&comm, &plan, None, &GradSyncOptions::default()).map(drop)
    });
    for result in results {
        assert!(matches!(result, Err(Error::Mismatch(_))), "{result:?}");
    }
}

#[test]
fn a_ready_order_of_the_wrong_length_is_refused() {
    let comm = Communicator::init_with(&concord::CommOptions {
        rank: Some(0), world_size: Some(1), ..Default::default()
    }).unwrap();
    let error = GradSync::new(&comm, &mixed_layouts(), Some(&[0, 1]), &GradSyncOptions::default())
        .map(drop).unwrap_err();
    assert_eq!(error.message(), "GradSync: ready_order has 2 indices for 5 gradients");
}
