//! What the integration tests share: seeded random data per rank, the
//! reference reductions (the definition, computed here element by
//! element), a collector of failed checks, ranks as threads meeting through
//! a store, and jobs of ranks started by concord-run.
#![allow(dead_code)] // each test file uses its own part

pub mod collectives;

use std::collections::hash_map::RandomState;
use std::fmt::Debug;
use std::hash::{BuildHasher, Hasher};
use std::process::Command;
use std::time::Duration;

use concord::{Communicator, Element, ReduceOp, Store, StoreServer, BF16, F16};

// ---- random data --------------------------------------------------------------------

/// SplitMix64: a small generator, seeded from a seed and a stream of
/// numbers (rank, case), so every rank can make every rank's data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: &[u64]) -> Rng {
        let mut rng = Rng(seed);
        for &s in stream {
            rng.0 ^= rng.next_u64().wrapping_add(s.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        rng
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [low, high).
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Uniform in [low, high).
    pub fn int(&mut self, low: i64, high: i64) -> i64 {
        low + (self.next_u64() % (high - low) as u64) as i64
    }
}

/// A fresh random seed, or CONCORD_TEST_SEED when set (a launched job's
/// ranks share their launcher's; set it to replay a failure).
pub fn seed() -> u64 {
    if let Ok(seed) = std::env::var("CONCORD_TEST_SEED") {
        return seed.parse().expect("CONCORD_TEST_SEED is a u64");
    }
    RandomState::new().build_hasher().finish()
}

// ---- element types, their data and reference reductions -----------------------------

/// An element type under test: its random data (in ranges where no
/// reference overflows), the reduce ops it supports, `op` over one value
/// per rank as the library defines it, and when a result is right.
pub trait Value: Element + Debug + PartialEq {
    const OPS: &'static [ReduceOp];
    fn random(rng: &mut Rng, op: ReduceOp) -> Self;
    fn reduce(values: &[Self], op: ReduceOp) -> Self;
    fn close(got: Self, expected: Self) -> bool;
}

const ALL_OPS: &[ReduceOp] =
    &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean];

/// np.isclose's rule.
fn isclose(got: f64, expected: f64, rtol: f64, atol: f64) -> bool {
    (got - expected).abs() <= atol + rtol * expected.abs()
}

/// Floating values accumulate in `$acc` (float32 for the 16-bit types),
/// and the result is rounded once to the type.
macro_rules! floating {
    ($ty:ty, $acc:ty, $to:expr, $from:expr, $rtol:expr, $atol:expr) => {
        impl Value for $ty {
            const OPS: &'static [ReduceOp] = ALL_OPS;
            fn random(rng: &mut Rng, op: ReduceOp) -> Self {
                let (low, high) = if op == ReduceOp::Prod { (0.5, 1.5) } else { (-2.0, 2.0) };
                $from(rng.uniform(low, high) as $acc)
            }
            fn reduce(values: &[Self], op: ReduceOp) -> Self {
                let wide = values.iter().map(|&v| $to(v));
                let acc: $acc = match op {
                    ReduceOp::Sum => wide.sum(),
                    ReduceOp::Prod => wide.product(),
                    ReduceOp::Max => wide.fold(<$acc>::NEG_INFINITY, <$acc>::max),
                    ReduceOp::Min => wide.fold(<$acc>::INFINITY, <$acc>::min),
                    ReduceOp::Mean => wide.sum::<$acc>() / values.len() as $acc,
                };
                $from(acc)
            }
            fn close(got: Self, expected: Self) -> bool {
                isclose($to(got) as f64, $to(expected) as f64, $rtol, $atol)
            }
        }
    };
}

floating!(f32, f32, |v: f32| v, |v: f32| v, 1e-5, 1e-6);
floating!(f64, f64, |v: f64| v, |v: f64| v, 1e-12, 1e-12);
floating!(F16, f32, F16::to_f32, F16::from_f32, 2e-3, 2e-3);
floating!(BF16, f32, BF16::to_f32, BF16::from_f32, 1.6e-2, 1.6e-2);

/// Integers accumulate in i64 and wrap to the type; a mean truncates
/// toward zero.
macro_rules! integer {
    ($ty:ty, $low:expr, $high:expr, $prod_low:expr, $prod_high:expr) => {
        impl Value for $ty {
            const OPS: &'static [ReduceOp] = ALL_OPS;
            fn random(rng: &mut Rng, op: ReduceOp) -> Self {
                let (low, high) = if op == ReduceOp::Prod { ($prod_low, $prod_high) }
                                  else { ($low, $high) };
                rng.int(low, high) as $ty
            }
            fn reduce(values: &[Self], op: ReduceOp) -> Self {
                let wide = values.iter().map(|&v| v as i64);
                (match op {
                    ReduceOp::Sum => wide.sum(),
                    ReduceOp::Prod => wide.product(),
                    ReduceOp::Max => wide.max().unwrap(),
                    ReduceOp::Min => wide.min().unwrap(),
                    ReduceOp::Mean => wide.sum::<i64>() / values.len() as i64,
                }) as $ty
            }
            fn close(got: Self, expected: Self) -> bool {
                got == expected
            }
        }
    };
}

integer!(i8, -20, 21, -2, 3);
integer!(i32, -20, 21, -2, 3);
integer!(i64, -20, 21, -2, 3);
integer!(u8, 0, 40, 0, 3);

impl Value for bool {
    const OPS: &'static [ReduceOp] = &[ReduceOp::Max, ReduceOp::Min];
    fn random(rng: &mut Rng, _op: ReduceOp) -> Self {
        rng.next_u64() & 1 == 1
    }
    fn reduce(values: &[Self], op: ReduceOp) -> Self {
        match op {
            ReduceOp::Max => values.iter().any(|&v| v),
            ReduceOp::Min => values.iter().all(|&v| v),
            other => panic!("bool has no {other:?}"),
        }
    }
    fn close(got: Self, expected: Self) -> bool {
        got == expected
    }
}

/// Rank `rank`'s `len` values for case `case`.
pub fn rank_data<T: Value>(seed: u64, rank: usize, case: u64, len: usize, op: ReduceOp) -> Vec<T> {
    let mut rng = Rng::new(seed, &[rank as u64, case]);
    (0..len).map(|_| T::random(&mut rng, op)).collect()
}

/// Element-wise `op` over every rank's data.
pub fn reference<T: Value>(data: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let len = data[0].len();
    let mut column = Vec::with_capacity(data.len());
    (0..len)
        .map(|i| {
            column.clear();
            column.extend(data.iter().map(|rank| rank[i]));
            T::reduce(&column, op)
        })
        .collect()
}

// ---- checks ---------------------------------------------------------------------------

/// The failed checks of one rank, collected rather than raised so that
/// every rank keeps issuing the same collectives and one run reports all.
pub struct Checks {
    pub rank: usize,
    pub failures: Vec<String>,
}

impl Checks {
    pub fn new(rank: usize) -> Checks {
        Checks { rank, failures: Vec::new() }
    }

    pub fn expect<T: Value>(&mut self, label: &str, got: &[T], expected: &[T]) {
        if got.len() != expected.len() {
            self.fail(label, format!("{} elements, expected {}", got.len(), expected.len()));
            return;
        }
        let bad: Vec<usize> = (0..got.len()).filter(|&i| !T::close(got[i], expected[i])).collect();
        if let Some(&first) = bad.first() {
            self.fail(label, format!("{} of {} elements differ, first at {first}: {:?} != {:?}",
                                     bad.len(), got.len(), got[first], expected[first]));
        }
    }

    pub fn expect_true(&mut self, label: &str, condition: bool) {
        if !condition {
            self.fail(label, "check failed".to_string());
        }
    }

    pub fn fail(&mut self, label: &str, problem: String) {
        self.failures.push(format!("rank {} {label}: {problem}", self.rank));
    }

    /// Panics with the first failures and the seed that reproduces them.
    pub fn assert_none(&self, seed: u64) {
        assert!(self.failures.is_empty(), "seed {seed} (CONCORD_TEST_SEED): {} checks failed:\n{}",
                self.failures.len(), self.failures.iter().take(40).cloned().collect::<Vec<_>>()
                    .join("\n"));
    }
}

// ---- ranks -----------------------------------------------------------------------------

/// Runs `body(comm)` on `n` threads, each a rank of one communicator that
/// meets through a store served here; returns the results in rank order.
pub fn thread_ranks<R: Send>(n: usize, body: impl Fn(Communicator) -> R + Sync) -> Vec<R> {
    let token = format!("{:016x}", seed());
    let server = StoreServer::new("127.0.0.1", 0, &token).unwrap();
    let port = server.port().unwrap();
    let timeout = Duration::from_secs(60);
    std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                let (body, token) = (&body, &token);
                scope.spawn(move || {
                    let store = Store::connect("127.0.0.1", port, token, timeout).unwrap();
                    let comm = Communicator::with_store(&store, "threads", rank, n, Some(timeout))
                        .unwrap();
                    body(comm)
                })
            })
            .collect();
        ranks.into_iter().map(|rank| rank.join().expect("a rank panicked")).collect()
    })
}

/// The Python whose concord-run starts jobs: $PYTHON, else python3 (as the
/// concord-sys build script finds the library).
fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Runs the ignored test `rank_test` of this test binary as `n` ranks of a
/// concord-run job sharing one fresh seed, with `env` set, and asserts that
/// every rank ran it and passed.
pub fn launch(n: usize, rank_test: &str, env: &[(&str, &str)]) {
    let seed = seed();
    let binary = std::env::current_exe().unwrap();
    let output = Command::new(python())
        .args(["-m", "concord.run", "-n", &n.to_string()])
        .arg(&binary)
        .args([rank_test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("CONCORD_TEST_SEED", seed.to_string())
        // A failing rank aborts its communicator; a rank that dies without
        // doing so leaves the others waiting at most this long.
        .env("CONCORD_TIMEOUT", "60")
        .envs(env.iter().copied())
        .output()
        .expect("concord-run starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(),
            "{n} ranks of {rank_test} (CONCORD_TEST_SEED={seed}): {}\n--- stdout ---\n{stdout}\n\
             --- stderr ---\n{stderr}", output.status);
    // Each rank's test binary reports its one test; a filter that matched
    // nothing would pass with none.
    let passed = stdout.lines().filter(|l| l.contains("test result: ok. 1 passed")).count();
    assert_eq!(passed, n, "expected {n} ranks to pass {rank_test}:\n{stdout}");
}

/// Runs `body`, and when it fails aborts `comm` first, so the peers fail at
/// once instead of waiting for this rank until their timeout.
pub fn abort_on_failure<R>(comm: &Communicator, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(panic) => {
            let _ = comm.abort();
            std::panic::resume_unwind(panic)
        }
    }
}
