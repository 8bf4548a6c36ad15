//! Every collective on every element type, in place and out of place,
//! blocking and asynchronous, each result checked against the reference
//! computed from every rank's data (which every rank makes from the seed).

use concord::{Communicator, ReduceOp, BF16, F16};

use super::{rank_data, reference, Checks, Value};

/// Odd lengths: empty, one element, a few, and (with the shared-memory
/// backend's chunks made as small as [`SMALL_CHUNKS`]) several chunks for
/// every element type.
pub const LENGTHS: [usize; 4] = [0, 1, 7, 5003];

/// Shared-memory chunks of 4 KiB (CONCORD_SHM_CHUNK_BYTES), so that small
/// buffers take the multi-chunk paths too.
pub const SMALL_CHUNKS: (&str, &str) = ("CONCORD_SHM_CHUNK_BYTES", "4096");

/// Runs every check on `comm`; every rank of it must call this with the
/// same seed and lengths.
pub fn check_all(comm: &Communicator, seed: u64, lengths: &[usize]) -> Checks {
    let mut run = Run { comm, seed, case: 0, checks: Checks::new(comm.rank()) };
    for &len in lengths {
        run.dtype::<f32>(len);
        run.dtype::<f64>(len);
        run.dtype::<F16>(len);
        run.dtype::<BF16>(len);
        run.dtype::<i8>(len);
        run.dtype::<i32>(len);
        run.dtype::<i64>(len);
        run.dtype::<u8>(len);
        run.dtype::<bool>(len);
    }
    run.overlapping_works();
    run.checks
}

struct Run<'c> {
    comm: &'c Communicator,
    seed: u64,
    case: u64,
    checks: Checks,
}

impl Run<'_> {
    /// Every rank's data for a new case.
    fn data<T: Value>(&mut self, len: usize, op: ReduceOp) -> Vec<Vec<T>> {
        self.case += 1;
        (0..self.comm.size()).map(|r| rank_data(self.seed, r, self.case, len, op)).collect()
    }

    fn dtype<T: Value>(&mut self, len: usize) {
        let name = T::DTYPE.name();
        for &op in T::OPS {
            self.all_reduce::<T>(&format!("all_reduce {op:?} {name} [{len}]"), len, op);
            self.reduce_scatter::<T>(&format!("reduce_scatter {op:?} {name} [{len}]"), len, op);
        }
        self.all_gather::<T>(&format!("all_gather {name} [{len}]"), len);
        self.broadcast::<T>(&format!("broadcast {name} [{len}]"), len);
    }

    /// Fails the check and the rest of this rank's run: a collective that
    /// errs leaves the ranks out of step.
    fn ok(&mut self, label: &str, result: concord::Result<()>) {
        if let Err(error) = result {
            panic!("rank {} {label}: {error}", self.comm.rank());
        }
    }

    fn all_reduce<T: Value>(&mut self, label: &str, len: usize, op: ReduceOp) {
        let comm = self.comm;
        let rank = comm.rank();
        for variant in ["in place", "out of place", "async in place", "async out of place"] {
            let data = self.data::<T>(len, op);
            let expected = reference(&data, op);
            let send = data[rank].clone();
            let mut recv = if variant.ends_with("in place") { send.clone() } else { self.stale(len) };
            let result = match variant {
                "in place" => comm.all_reduce(&mut recv, op),
                "out of place" => comm.all_reduce_into(&send, &mut recv, op),
                "async in place" => comm.all_reduce_async(&mut recv, op).and_then(|w| w.wait()),
                _ => comm.all_reduce_into_async(&send, &mut recv, op).and_then(|w| w.wait()),
            };
            self.ok(&format!("{label} {variant}"), result);
            self.checks.expect(&format!("{label} {variant}"), &recv, &expected);
            self.checks.expect(&format!("{label} {variant}: send untouched"), &send, &data[rank]);
        }
    }

    fn reduce_scatter<T: Value>(&mut self, label: &str, len: usize, op: ReduceOp) {
        let comm = self.comm;
        let (rank, size) = (comm.rank(), comm.size());
        for asynchronous in [false, true] {
            let data = self.data::<T>(len * size, op);
            let expected = reference(&data, op)[rank * len..(rank + 1) * len].to_vec();
            let mut recv = self.stale(len);
            let result = if asynchronous {
                comm.reduce_scatter_async(&data[rank], &mut recv, op).and_then(|w| w.wait())
            } else {
                comm.reduce_scatter(&data[rank], &mut recv, op)
            };
            let label = format!("{label}{}", if asynchronous { " async" } else { "" });
            self.ok(&label, result);
            self.checks.expect(&label, &recv, &expected);
        }
    }

    fn all_gather<T: Value>(&mut self, label: &str, len: usize) {
        let comm = self.comm;
        let (rank, size) = (comm.rank(), comm.size());
        for asynchronous in [false, true] {
            let data = self.data::<T>(len, ReduceOp::Sum);
            let expected: Vec<T> = data.concat();
            let mut recv = self.stale(len * size);
            let result = if asynchronous {
                comm.all_gather_async(&data[rank], &mut recv).and_then(|w| w.wait())
            } else {
                comm.all_gather(&data[rank], &mut recv)
            };
            let label = format!("{label}{}", if asynchronous { " async" } else { "" });
            self.ok(&label, result);
            self.checks.expect(&label, &recv, &expected);
        }
    }

    fn broadcast<T: Value>(&mut self, label: &str, len: usize) {
        let comm = self.comm;
        let (rank, size) = (comm.rank(), comm.size());
        for variant in ["in place", "out of place", "async in place", "async out of place"] {
            let root = (self.case as usize) % size;
            let data = self.data::<T>(len, ReduceOp::Sum);
            let mut recv = if variant.ends_with("in place") {
                data[rank].clone()
            } else {
                self.stale(len)
            };
            // Off the root, out of place sends nothing.
            let send = (rank == root).then_some(data[rank].as_slice());
            let result = match variant {
                "in place" => comm.broadcast(&mut recv, root),
                "out of place" => comm.broadcast_into(send, &mut recv, root),
                "async in place" => comm.broadcast_async(&mut recv, root).and_then(|w| w.wait()),
                _ => comm.broadcast_into_async(send, &mut recv, root).and_then(|w| w.wait()),
            };
            let label = format!("{label} from {root} {variant}");
            self.ok(&label, result);
            self.checks.expect(&label, &recv, &data[root]);
        }
    }

    /// Works in flight at once, waited for in reverse order: each still
    /// gets its own result (collectives complete in issue order).
    fn overlapping_works(&mut self) {
        let comm = self.comm;
        let rank = comm.rank();
        let sums = self.data::<f64>(1001, ReduceOp::Sum);
        let maxima = self.data::<i32>(1001, ReduceOp::Max);
        let (mut sum, mut max) = (sums[rank].clone(), maxima[rank].clone());
        let result = (|| {
            let first = comm.all_reduce_async(&mut sum, ReduceOp::Sum)?;
            let barrier = comm.barrier_async()?;
            let second = comm.all_reduce_async(&mut max, ReduceOp::Max)?;
            second.wait()?;
            barrier.wait()?;
            first.wait()
        })();
        self.ok("overlapping works", result);
        self.checks.expect("overlapping all_reduce sum", &sum, &reference(&sums, ReduceOp::Sum));
        self.checks.expect("overlapping all_reduce max", &max, &reference(&maxima, ReduceOp::Max));
    }

    /// A buffer of other values than the result, for a recv to start with.
    fn stale<T: Value>(&self, len: usize) -> Vec<T> {
        rank_data(self.seed, usize::MAX, self.case, len, ReduceOp::Sum)
    }
}
