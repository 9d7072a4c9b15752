//! Descriptive statistics with pandas/numpy semantics (linear quantiles, sample standard deviation).

use serde::Serialize;

/// numpy's `_lerp`: `a + (b - a)·t`, computed from the upper end when `t ≥ 0.5` (numpy does this
/// so that the result is monotonic).
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    let diff = b - a;
    if t >= 0.5 {
        b - diff * (1.0 - t)
    } else {
        a + diff * t
    }
}

/// The `q` quantile (0..=1) of `sorted` (ascending) with numpy's default "linear" method, as
/// `pandas.Series.quantile` computes it; `None` for an empty slice.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    // pandas passes `q * 100` to numpy, which divides by 100 again.
    let q = (q * 100.0) / 100.0;
    let virtual_index = q * (n - 1) as f64;
    let below = virtual_index.floor();
    let lo = (below.max(0.0) as usize).min(n - 1);
    let hi = (lo + 1).min(n - 1);
    let gamma = virtual_index - below;
    Some(lerp(sorted[lo], sorted[hi], gamma))
}

/// Sample standard deviation (ddof = 1); `None` with fewer than two values.
pub fn std_sample(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let ss: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
    Some((ss / (n - 1.0)).sqrt())
}

/// What `pandas.Series.describe()` gives for a numeric series (missing values already removed).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Describe {
    /// Number of values.
    pub count: usize,
    /// Mean; `None` when empty.
    pub mean: Option<f64>,
    /// Sample standard deviation; `None` with fewer than two values.
    pub std: Option<f64>,
    /// Minimum.
    pub min: Option<f64>,
    /// 25th percentile (linear).
    pub p25: Option<f64>,
    /// Median.
    pub p50: Option<f64>,
    /// 75th percentile (linear).
    pub p75: Option<f64>,
    /// Maximum.
    pub max: Option<f64>,
}

impl Describe {
    /// Describes `values` (any order).
    pub fn of(values: &[f64]) -> Describe {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        Describe {
            count: n,
            mean: (n > 0).then(|| sorted.iter().sum::<f64>() / n as f64),
            std: std_sample(&sorted),
            min: sorted.first().copied(),
            p25: quantile_sorted(&sorted, 0.25),
            p50: quantile_sorted(&sorted, 0.5),
            p75: quantile_sorted(&sorted, 0.75),
            max: sorted.last().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_numpy() {
        // numpy.quantile([1, 2, 3, 4], [0.25, 0.5, 0.75]) == [1.75, 2.5, 3.25]
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&v, 0.25), Some(1.75));
        assert_eq!(quantile_sorted(&v, 0.5), Some(2.5));
        assert_eq!(quantile_sorted(&v, 0.75), Some(3.25));
        assert_eq!(quantile_sorted(&[5.0], 0.8), Some(5.0));
        assert_eq!(quantile_sorted(&[], 0.8), None);
        // numpy.quantile([10, 30, 60, 100, 150], 0.8) == 110.00000000000001 (numpy's lerp)
        assert_eq!(
            quantile_sorted(&[10.0, 30.0, 60.0, 100.0, 150.0], 0.8),
            Some(110.00000000000001)
        );
    }

    #[test]
    fn describe_like_pandas() {
        let d = Describe::of(&[7.0, 1.0, 4.0]);
        assert_eq!(d.count, 3);
        assert_eq!(d.mean, Some(4.0));
        assert_eq!(d.std, Some(3.0));
        assert_eq!((d.min, d.p50, d.max), (Some(1.0), Some(4.0), Some(7.0)));
        assert_eq!((d.p25, d.p75), (Some(2.5), Some(5.5)));
        let one = Describe::of(&[2.0]);
        assert_eq!((one.count, one.std), (1, None));
        assert_eq!(Describe::of(&[]).mean, None);
    }
}
