//! 16-bit floating-point element types: IEEE binary16 ([`F16`]) and
//! bfloat16 ([`BF16`]), stored as their bits. Conversions from `f32` round
//! to nearest, ties to even, as the library's own codec does.

use std::fmt;

/// An IEEE 754 binary16 value, as its bits. `==` compares bits (so `0.0`
/// and `-0.0` differ, and a NaN equals itself).
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// A bfloat16 value (the upper half of an `f32`), as its bits. `==`
/// compares bits.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BF16(pub u16);

impl F16 {
    /// The nearest binary16 value (ties to even); beyond the largest finite
    /// value (65504) by half a unit or more, infinity. NaN stays NaN.
    pub fn from_f32(x: f32) -> F16 {
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let abs = bits & 0x7fff_ffff;
        if abs >= 0x7f80_0000 {
            // Infinity, or a NaN kept quiet with the top of its payload.
            let nan = if abs > 0x7f80_0000 { 0x0200 | ((abs >> 13) & 0x3ff) as u16 } else { 0 };
            return F16(sign | 0x7c00 | nan);
        }
        if abs >= 0x4780_0000 {
            return F16(sign | 0x7c00); // 65536 and beyond
        }
        if abs < 0x3300_0000 {
            return F16(sign); // below half the smallest subnormal (2^-25)
        }
        let (kept, dropped_bits) = if abs < 0x3880_0000 {
            // A subnormal result, counted in units of 2^-24: the 24-bit
            // significand shifted right by 126 - exponent (14 to 24).
            let exponent = abs >> 23;
            (abs & 0x7f_ffff | 0x80_0000, 126 - exponent)
        } else {
            // A normal result: rebias the exponent (127 -> 15) and drop 13
            // mantissa bits; a carry out of the mantissa bumps the exponent,
            // up to infinity.
            (abs - (112 << 23), 13)
        };
        F16(sign | round_shift(kept, dropped_bits) as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        let sign = if self.0 & 0x8000 != 0 { -1.0 } else { 1.0 };
        let exponent = u32::from((self.0 >> 10) & 0x1f);
        let mantissa = u32::from(self.0 & 0x3ff);
        match exponent {
            0 => sign * mantissa as f32 * (1.0 / 16_777_216.0), // 2^-24 units
            0x1f => f32::from_bits(u32::from(self.0 & 0x8000) << 16 | 0x7f80_0000 | mantissa << 13),
            _ => f32::from_bits(u32::from(self.0 & 0x8000) << 16 | (exponent + 112) << 23 | mantissa << 13),
        }
    }
}

impl BF16 {
    /// The nearest bfloat16 value (ties to even). NaN stays NaN.
    pub fn from_f32(x: f32) -> BF16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return BF16((bits >> 16) as u16 | 0x0040);
        }
        BF16((round_shift(bits, 16)) as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

/// `value >> shift`, rounded to nearest with ties to even (shift >= 1).
fn round_shift(value: u32, shift: u32) -> u32 {
    let kept = value >> shift;
    let dropped = value & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if dropped > half || (dropped == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

macro_rules! float_like {
    ($($ty:ident),*) => {$(
        impl From<f32> for $ty {
            fn from(x: f32) -> Self {
                $ty::from_f32(x)
            }
        }

        impl From<$ty> for f32 {
            fn from(x: $ty) -> f32 {
                x.to_f32()
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($ty), self.to_f32())
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }
    )*};
}

float_like!(F16, BF16);

#[cfg(test)]
mod tests {
    use super::*;

    /// The f16 values in increasing order of value, from -inf to +inf.
    fn ordered_finite_and_infinite() -> Vec<F16> {
        let negative = (0x8000u16..=0xfc00).rev().map(F16);
        let positive = (0x0000u16..=0x7c00).map(F16);
        negative.chain(positive).collect()
    }

    #[test]
    fn every_f16_survives_a_round_trip() {
        for bits in 0..=u16::MAX {
            let x = F16(bits);
            let back = F16::from_f32(x.to_f32());
            if x.to_f32().is_nan() {
                assert!(back.to_f32().is_nan(), "{bits:#06x}");
            } else {
                assert_eq!(back, x, "{bits:#06x} -> {} -> {:#06x}", x.to_f32(), back.0);
            }
        }
    }

    #[test]
    fn f16_to_f32_is_monotonic_and_exact() {
        let values: Vec<f64> = ordered_finite_and_infinite().iter().map(|h| h.to_f32() as f64).collect();
        // -0 and +0 are equal; every other neighbour is strictly larger.
        for pair in values.windows(2) {
            assert!(pair[0] <= pair[1], "{pair:?}");
        }
        assert_eq!(F16(0x3c00).to_f32(), 1.0);
        assert_eq!(F16(0x7bff).to_f32(), 65504.0);
        assert_eq!(F16(0x0001).to_f32(), 2f32.powi(-24));
        assert_eq!(F16(0x0400).to_f32(), 2f32.powi(-14));
        assert_eq!(F16(0xc000).to_f32(), -2.0);
    }

    /// from_f32 picks the nearest f16 (ties to the even bit pattern), found
    /// here by searching the ordered values, for f32 values drawn over the
    /// whole range: normal, subnormal, overflowing.
    #[test]
    fn f16_from_f32_rounds_to_nearest_even() {
        let ordered = ordered_finite_and_infinite();
        let values: Vec<f64> = ordered.iter().map(|h| h.to_f32() as f64).collect();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            // xorshift64: the f32 bit patterns up to 2^17 in magnitude.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits((state as u32) & 0xc7ff_ffff);
            if x.is_nan() {
                continue;
            }
            let got = F16::from_f32(x);
            let target = x as f64;
            let i = values.partition_point(|&v| v < target);
            let expected = if i < values.len() && values[i] == target {
                ordered[i]
            } else {
                let (below, above) = (ordered[i - 1], ordered[i]);
                let (lo, hi) = (values[i - 1], values[i]);
                if hi.is_infinite() {
                    // Infinity once x reaches 65504 + half a unit (16).
                    if target.abs() >= 65520.0 { above } else { below }
                } else if lo.is_infinite() {
                    if target.abs() >= 65520.0 { below } else { above }
                } else if target - lo < hi - target {
                    below
                } else if target - lo > hi - target {
                    above
                } else if below.0 & 1 == 0 {
                    below
                } else {
                    above
                }
            };
            assert_eq!(got, expected, "{x:e}");
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(BF16::from_f32(1.0), BF16(0x3f80));
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(BF16::from_f32(1.0 + 2f32.powi(-8)), BF16(0x3f80));
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is up.
        assert_eq!(BF16::from_f32(1.0 + 3.0 * 2f32.powi(-8)), BF16(0x3f82));
        assert_eq!(BF16::from_f32(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), BF16(0x3f81));
        assert_eq!(BF16::from_f32(f32::MAX), BF16(0x7f80)); // rounds up to infinity
        assert!(BF16::from_f32(f32::NAN).to_f32().is_nan());
        for bits in 0..=u16::MAX {
            let x = BF16(bits);
            if !x.to_f32().is_nan() {
                assert_eq!(BF16::from_f32(x.to_f32()), x);
            }
        }
    }
}
