//! Multi-rank tests as jobs of processes started by concord-run, the way a
//! program of a user runs: each `#[test]` here launches its ignored
//! counterpart of this binary as the ranks of a job, and each rank checks
//! its results against references computed from every rank's data.

mod support;

use concord::{Communicator, ReduceOp};

use support::collectives::{check_all, LENGTHS, SMALL_CHUNKS};

/// Every collective on every element type, over 3 ranks.
#[test]
fn collectives_on_three_ranks() {
    support::launch(3, "rank_of_collectives", &[SMALL_CHUNKS]);
}

#[test]
#[ignore = "a rank of the job collectives_on_three_ranks starts"]
fn rank_of_collectives() {
    let comm = Communicator::init().unwrap();
    assert_eq!(comm.size(), 3);
    let seed = support::seed();
    let checks = support::abort_on_failure(&comm, || check_all(&comm, seed, &LENGTHS));
    checks.assert_none(seed);
}

/// split: the even and the odd ranks of 4 each form a communicator, ranked
/// by descending world rank, whose collectives involve its members only.
#[test]
fn split_on_four_ranks() {
    support::launch(4, "rank_of_split", &[]);
}

#[test]
#[ignore = "a rank of the job split_on_four_ranks starts"]
fn rank_of_split() {
    let world = Communicator::init().unwrap();
    let (rank, size) = (world.rank(), world.size());
    let seed = support::seed();
    support::abort_on_failure(&world, || {
        let half = world.split(Some(rank % 2), -(rank as i32)).unwrap().expect("a member");
        let members: Vec<usize> = (0..size).filter(|r| r % 2 == rank % 2).rev().collect();
        assert_eq!(half.size(), members.len());
        assert_eq!(members[half.rank()], rank);
        let data: Vec<Vec<i64>> = (0..size)
            .map(|r| support::rank_data(seed, r, 1, 1001, ReduceOp::Sum))
            .collect();
        let mut mine = data[rank].clone();
        half.all_reduce(&mut mine, ReduceOp::Sum).unwrap();
        let group: Vec<Vec<i64>> = members.iter().map(|&r| data[r].clone()).collect();
        assert_eq!(mine, support::reference(&group, ReduceOp::Sum));
        // Ranks that pass no color get no communicator.
        let odd_only = world.split((rank % 2 == 1).then_some(0), 0).unwrap();
        assert_eq!(odd_only.map(|c| c.size()), (rank % 2 == 1).then_some(members.len()));
        world.barrier().unwrap();
    });
}
