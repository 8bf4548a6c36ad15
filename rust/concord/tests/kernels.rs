//! Optimizer steps, gradient norms and metric updates, against references
//! computed here from their definitions (torch.optim's rules, counting).

mod support;

use concord::{adamw_step, clip_by_sum_of_squares, metric_update, scale, sgd_step,
              sum_of_squares, sum_of_squares_into, AdamWOptions, Error, MetricOptions, ReduceOp,
              SgdOptions, TensorMut, TensorRef};

use support::{rank_data, Checks, Rng};

/// `len` values in [-2, 2) for case `case`.
fn values(seed: u64, case: u64, len: usize) -> Vec<f64> {
    rank_data(seed, 0, case, len, ReduceOp::Sum)
}

fn close(checks: &mut Checks, label: &str, got: &[f64], expected: &[f64], rtol: f64) {
    let bad = got.iter().zip(expected).filter(|(g, e)| (*g - *e).abs() > rtol * (1.0 + e.abs()));
    let count = bad.count();
    checks.expect_true(&format!("{label}: {count} of {} elements off", got.len()),
                       count == 0 && got.len() == expected.len());
}

/// torch.optim.SGD (dampening 0) on one tensor, in float64.
fn sgd_reference(o: &SgdOptions, p: &mut [f64], g: &[f64], buf: &mut [f64]) {
    for i in 0..p.len() {
        let d = g[i] + o.weight_decay * p[i];
        if o.momentum == 0.0 {
            p[i] -= o.lr * d;
            continue;
        }
        buf[i] = if o.step == 1 { d } else { o.momentum * buf[i] + d };
        p[i] -= o.lr * if o.nesterov { d + o.momentum * buf[i] } else { buf[i] };
    }
}

/// torch.optim.AdamW on one tensor, in float64.
fn adamw_reference(o: &AdamWOptions, p: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64]) {
    let bc1 = 1.0 - o.beta1.powi(o.step as i32);
    let bc2 = 1.0 - o.beta2.powi(o.step as i32);
    for i in 0..p.len() {
        m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
        v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
        p[i] *= 1.0 - o.lr * o.weight_decay;
        p[i] -= o.lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + o.eps);
    }
}

#[test]
fn sgd_follows_torchs_rule_over_steps() {
    let seed = support::seed();
    let mut checks = Checks::new(0);
    let variants = [
        SgdOptions { lr: 0.1, ..Default::default() },
        SgdOptions { lr: 0.05, momentum: 0.9, weight_decay: 0.01, ..Default::default() },
        SgdOptions { lr: 0.05, momentum: 0.8, nesterov: true, ..Default::default() },
    ];
    for (v, options) in variants.iter().enumerate() {
        // A float64 tensor of 1001 elements and a float32 one of 7, together.
        let mut p64 = values(seed, 10 * v as u64, 1001);
        let mut p32: Vec<f32> = values(seed, 10 * v as u64 + 1, 7).iter().map(|&x| x as f32).collect();
        let (mut b64, mut b32) = (vec![0.0f64; 1001], vec![0.0f32; 7]);
        let (mut ref64, mut ref32): (Vec<f64>, Vec<f64>) =
            (p64.clone(), p32.iter().map(|&x| x as f64).collect());
        let (mut rb64, mut rb32) = (vec![0.0; 1001], vec![0.0; 7]);
        for step in 1..=3 {
            let options = SgdOptions { step, ..*options };
            let g64 = values(seed, 100 * step as u64 + v as u64, 1001);
            let g32: Vec<f32> = values(seed, 200 * step as u64 + v as u64, 7).iter()
                .map(|&x| x as f32).collect();
            let mut buffers = if options.momentum > 0.0 {
                vec![TensorMut::from(&mut b64), TensorMut::from(&mut b32)]
            } else {
                vec![]
            };
            sgd_step(&options, &mut [TensorMut::from(&mut p64), TensorMut::from(&mut p32)],
                     &[TensorRef::from(&g64), TensorRef::from(&g32)], &mut buffers).unwrap();
            sgd_reference(&options, &mut ref64, &g64, &mut rb64);
            let g32_wide: Vec<f64> = g32.iter().map(|&x| x as f64).collect();
            sgd_reference(&options, &mut ref32, &g32_wide, &mut rb32);
        }
        let p32_wide: Vec<f64> = p32.iter().map(|&x| x as f64).collect();
        close(&mut checks, &format!("sgd {options:?} float64"), &p64, &ref64, 1e-12);
        close(&mut checks, &format!("sgd {options:?} float32"), &p32_wide, &ref32, 1e-5);
    }
    checks.assert_none(seed);
}

#[test]
fn adamw_follows_torchs_rule_over_steps() {
    let seed = support::seed();
    let mut checks = Checks::new(0);
    let mut p64 = values(seed, 1, 513);
    let mut p32: Vec<f32> = values(seed, 2, 33).iter().map(|&x| x as f32).collect();
    let (mut m64, mut v64, mut m32, mut v32) =
        (vec![0.0f64; 513], vec![0.0f64; 513], vec![0.0f32; 33], vec![0.0f32; 33]);
    let mut ref64 = p64.clone();
    let mut ref32: Vec<f64> = p32.iter().map(|&x| x as f64).collect();
    let (mut rm64, mut rv64, mut rm32, mut rv32) =
        (vec![0.0; 513], vec![0.0; 513], vec![0.0; 33], vec![0.0; 33]);
    for step in 1..=4 {
        let options = AdamWOptions { lr: 0.01, weight_decay: 0.1, step, ..Default::default() };
        let g64 = values(seed, 10 + step as u64, 513);
        let g32: Vec<f32> = values(seed, 20 + step as u64, 33).iter().map(|&x| x as f32).collect();
        adamw_step(&options, &mut [TensorMut::from(&mut p64), TensorMut::from(&mut p32)],
                   &[TensorRef::from(&g64), TensorRef::from(&g32)],
                   &mut [TensorMut::from(&mut m64), TensorMut::from(&mut m32)],
                   &mut [TensorMut::from(&mut v64), TensorMut::from(&mut v32)]).unwrap();
        adamw_reference(&options, &mut ref64, &g64, &mut rm64, &mut rv64);
        let g32_wide: Vec<f64> = g32.iter().map(|&x| x as f64).collect();
        adamw_reference(&options, &mut ref32, &g32_wide, &mut rm32, &mut rv32);
    }
    close(&mut checks, "adamw float64", &p64, &ref64, 1e-12);
    let p32_wide: Vec<f64> = p32.iter().map(|&x| x as f64).collect();
    close(&mut checks, "adamw float32", &p32_wide, &ref32, 1e-5);
    checks.assert_none(seed);
}

#[test]
fn optimizer_arguments_are_checked_before_any_write() {
    let (mut p, g) = (vec![1.0f32; 4], vec![1.0f32; 4]);
    let error = sgd_step(&SgdOptions::default(), &mut [TensorMut::from(&mut p)], &[], &mut [])
        .unwrap_err();
    assert_eq!(error.message(), "sgd_step: 1 params but 0 grads; pass one per parameter");
    let negative = SgdOptions { lr: -1.0, ..Default::default() };
    let error = sgd_step(&negative, &mut [TensorMut::from(&mut p)], &[TensorRef::from(&g)], &mut [])
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(ref m) if m.contains("lr")), "{error}");
    let mut ints = vec![1i32; 4];
    let error = sgd_step(&SgdOptions::default(), &mut [TensorMut::from(&mut ints)],
                         &[TensorRef::from(&g)], &mut []).unwrap_err();
    assert!(error.message().contains("int32"), "{error}");
    assert_eq!(p, vec![1.0; 4]);
}

#[test]
fn norms_scaling_and_clipping() {
    let seed = support::seed();
    let a = values(seed, 1, 1000);
    let b: Vec<f32> = values(seed, 2, 17).iter().map(|&x| x as f32).collect();
    let expected: f64 = a.iter().map(|x| x * x).sum::<f64>()
        + b.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
    let got = sum_of_squares(&[TensorRef::from(&a), TensorRef::from(&b)]).unwrap();
    assert!((got - expected).abs() <= 1e-12 * expected, "{got} != {expected}");
    let mut into = [0.0f64];
    sum_of_squares_into(&[TensorRef::from(&a), TensorRef::from(&b)],
                        &mut TensorMut::new(&mut into, &[]).unwrap()).unwrap();
    assert!((into[0] - expected).abs() <= 1e-12 * expected);

    let (mut a2, mut b2) = (a.clone(), b.clone());
    scale(&mut [TensorMut::from(&mut a2), TensorMut::from(&mut b2)], -0.5).unwrap();
    assert!(a2.iter().zip(&a).all(|(x, y)| *x == -0.5 * y));
    assert!(b2.iter().zip(&b).all(|(x, y)| *x == -0.5 * y));

    // Clipping to a norm of 1: every element times 1 / (norm + 1e-6).
    let factor = 1.0 / (expected.sqrt() + 1e-6);
    let (mut a3, mut b3) = (a.clone(), b.clone());
    clip_by_sum_of_squares(&mut [TensorMut::from(&mut a3), TensorMut::from(&mut b3)],
                           &TensorRef::new(&into, &[]).unwrap(), 1.0).unwrap();
    assert!(a3.iter().zip(&a).all(|(x, y)| (x - y * factor).abs() <= 1e-12));
    assert!(b3.iter().zip(&b).all(|(x, y)| ((*x as f64) - (*y as f64) * factor).abs() <= 1e-6));
    // Under the limit: untouched.
    clip_by_sum_of_squares(&mut [TensorMut::from(&mut a3)], &TensorRef::new(&into, &[]).unwrap(),
                           f64::INFINITY).unwrap();
    assert!(a3.iter().zip(&a).all(|(x, y)| (x - y * factor).abs() <= 1e-12));
}

#[test]
fn confusion_matrix_counts_labels_and_argmax_of_scores() {
    let seed = support::seed();
    let mut rng = Rng::new(seed, &[1]);
    let (n, c) = (1003usize, 5usize);
    let target: Vec<i64> = (0..n).map(|_| rng.int(0, c as i64)).collect();
    let labels: Vec<u8> = (0..n).map(|_| rng.int(0, c as i64) as u8).collect();
    let scores: Vec<f32> = (0..n * c).map(|_| rng.uniform(0.0, 1.0) as f32).collect();

    let mut expected = vec![0i64; c * c];
    for i in 0..n {
        expected[target[i] as usize * c + labels[i] as usize] += 1;
        let row = &scores[i * c..(i + 1) * c];
        let argmax = (0..c).fold(0, |best, j| if row[j] > row[best] { j } else { best });
        expected[target[i] as usize * c + argmax] += 1;
    }
    let mut state = vec![0i64; c * c];
    let mut view = TensorMut::new(&mut state, &[c, c]).unwrap();
    let options = MetricOptions::default();
    metric_update("confusion_matrix", &mut view,
                  &[TensorRef::from(&labels), TensorRef::from(&target)], &options).unwrap();
    metric_update("confusion_matrix", &mut view,
                  &[TensorRef::new(&scores, &[n, c]).unwrap(), TensorRef::from(&target)],
                  &options).unwrap();
    assert_eq!(state, expected, "seed {seed}");

    // A label out of range is refused, and the state is left as it was.
    let bad_target: Vec<i64> = target.iter().map(|&t| if t == 3 { 7 } else { t }).collect();
    let mut view = TensorMut::new(&mut state, &[c, c]).unwrap();
    let error = metric_update("confusion_matrix", &mut view,
                              &[TensorRef::from(&labels), TensorRef::from(&bad_target)], &options)
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(ref m) if m.contains('7')), "{error}");
    assert_eq!(state, expected);
}

#[test]
fn weighted_sums_and_extremes() {
    let seed = support::seed();
    let x = values(seed, 1, 999);
    let w: Vec<f32> = values(seed, 2, 999).iter().map(|&v| v.abs() as f32).collect();
    let mut sums = [0.0f64; 2];
    let mut view = TensorMut::from(&mut sums[..]);
    let options = MetricOptions::default();
    metric_update("weighted_sum", &mut view, &[TensorRef::from(&x)], &options).unwrap();
    metric_update("weighted_sum", &mut view, &[TensorRef::from(&x), TensorRef::from(&w)],
                  &options).unwrap();
    let weighted: f64 = x.iter().zip(&w).map(|(a, b)| a * *b as f64).sum();
    let expected = [x.iter().sum::<f64>() + weighted,
                    x.len() as f64 + w.iter().map(|&b| b as f64).sum::<f64>()];
    for (got, want) in sums.iter().zip(expected) {
        assert!((got - want).abs() <= 1e-9 * (1.0 + want.abs()), "{got} != {want}");
    }
    let mut max = [f64::NEG_INFINITY];
    metric_update("max", &mut TensorMut::new(&mut max, &[1]).unwrap(), &[TensorRef::from(&x)],
                  &options).unwrap();
    assert_eq!(max[0], x.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
}

#[test]
fn an_unknown_kernel_lists_the_valid_ones() {
    let mut state = [0i64; 2];
    let error = metric_update("accuracy", &mut TensorMut::from(&mut state[..]), &[],
                              &MetricOptions::default()).unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)));
    for kernel in ["weighted_sum", "confusion_matrix", "topk_correct", "binary_histogram"] {
        assert!(error.message().contains(kernel), "{error}");
    }
}
