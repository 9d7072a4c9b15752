//! The op table's `--sort` and `--group-by`: what `key_averages(group_by_input_shape=True)
//! .table(sort_by=...)` gives, with torch's `sort_by` names accepted too.

use std::cmp::Ordering;

use clap::ValueEnum;
use kinetrace_analysis::ops::OpStat;

/// A column of the op table to sort by, largest first (`name`: A to Z). A percentage column sorts
/// as the time it is a share of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OpSort {
    /// Self CPU time (the default; torch: self_cpu_time_total).
    #[default]
    #[value(alias = "self_cpu_time_total", alias = "self-cpu-pct")]
    SelfCpu,
    /// Total CPU time (torch: cpu_time_total).
    #[value(alias = "cpu_time_total", alias = "total-cpu-pct")]
    TotalCpu,
    /// CPU time per call (torch: cpu_time).
    #[value(alias = "cpu_time")]
    CpuAvg,
    /// Self GPU time (torch: self_cuda_time_total, self_device_time_total).
    #[value(
        alias = "self_cuda_time_total",
        alias = "self_device_time_total",
        alias = "self-gpu-pct"
    )]
    SelfGpu,
    /// Total GPU time (torch: cuda_time_total, device_time_total).
    #[value(
        alias = "cuda_time_total",
        alias = "device_time_total",
        alias = "total-gpu-pct"
    )]
    TotalGpu,
    /// GPU time per call (torch: cuda_time, device_time).
    #[value(alias = "cuda_time", alias = "device_time")]
    GpuAvg,
    /// Number of calls (torch: count).
    #[value(alias = "calls")]
    Count,
    /// CPU memory allocated by the op itself (torch: self_cpu_memory_usage).
    #[value(alias = "self_cpu_memory_usage")]
    SelfCpuMem,
    /// CPU memory allocated with nested ops (torch: cpu_memory_usage).
    #[value(alias = "cpu_memory_usage")]
    CpuMem,
    /// GPU memory allocated by the op itself (torch: self_cuda_memory_usage).
    #[value(alias = "self_cuda_memory_usage", alias = "self_device_memory_usage")]
    SelfGpuMem,
    /// GPU memory allocated with nested ops (torch: cuda_memory_usage).
    #[value(alias = "cuda_memory_usage", alias = "device_memory_usage")]
    GpuMem,
    /// Name, A to Z.
    Name,
}

/// What the op table groups by besides kind and name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GroupBy {
    /// The ops' input shapes (`Input Dims`, recorded with `--record-shapes` / `record_shapes=True`).
    Shape,
}

impl OpSort {
    /// The column's value for `o` (larger first), or `None` for `name`.
    fn key(self, o: &OpStat) -> Option<f64> {
        Some(match self {
            OpSort::SelfCpu => o.cpu_self_us.0,
            OpSort::TotalCpu => o.cpu_total_us.0,
            OpSort::CpuAvg => o.cpu_avg_us.0,
            OpSort::SelfGpu => o.gpu_self_us.0,
            OpSort::TotalGpu => o.gpu_total_us.0,
            OpSort::GpuAvg => o.gpu_avg_us.0,
            OpSort::Count => o.count as f64,
            OpSort::SelfCpuMem => o.cpu_mem_self_bytes as f64,
            OpSort::CpuMem => o.cpu_mem_bytes as f64,
            OpSort::SelfGpuMem => o.gpu_mem_self_bytes as f64,
            OpSort::GpuMem => o.gpu_mem_bytes as f64,
            OpSort::Name => return None,
        })
    }

    /// The table's title words for this order.
    pub fn describe(self) -> &'static str {
        match self {
            OpSort::SelfCpu => "most self CPU time first",
            OpSort::TotalCpu => "most total CPU time first",
            OpSort::CpuAvg => "most CPU time per call first",
            OpSort::SelfGpu => "most self GPU time first",
            OpSort::TotalGpu => "most total GPU time first",
            OpSort::GpuAvg => "most GPU time per call first",
            OpSort::Count => "most calls first",
            OpSort::SelfCpuMem => "most self CPU memory first",
            OpSort::CpuMem => "most CPU memory first",
            OpSort::SelfGpuMem => "most self GPU memory first",
            OpSort::GpuMem => "most GPU memory first",
            OpSort::Name => "by name",
        }
    }

    /// Sorts `ops` by this column; ties by self CPU time, then kind, name and shape.
    pub fn sort(self, ops: &mut [OpStat]) {
        let tie = |a: &OpStat, b: &OpStat| {
            b.cpu_self_us
                .0
                .total_cmp(&a.cpu_self_us.0)
                .then_with(|| (a.kind, &a.name, &a.shape).cmp(&(b.kind, &b.name, &b.shape)))
        };
        ops.sort_by(|a, b| match (self.key(a), self.key(b)) {
            (Some(x), Some(y)) => y.total_cmp(&x).then_with(|| tie(a, b)),
            _ => (&a.name, &a.shape, a.kind)
                .cmp(&(&b.name, &b.shape, b.kind))
                .then(Ordering::Equal),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinetrace_analysis::ops::OpKind;
    use kinetrace_analysis::units::{Num, Us};

    fn op(name: &str, count: u64, self_cpu: f64, total_cpu: f64, cpu_mem: i64) -> OpStat {
        OpStat {
            kind: OpKind::CpuOp,
            name: name.into(),
            count,
            cpu_total_us: Us(total_cpu),
            cpu_self_us: Us(self_cpu),
            gpu_self_us: Us(0.0),
            gpu_total_us: Us(0.0),
            shape: None,
            cpu_avg_us: Us(total_cpu / count as f64),
            gpu_avg_us: Us(0.0),
            cpu_self_pct: Num(f64::NAN),
            cpu_total_pct: Num(f64::NAN),
            gpu_self_pct: Num(f64::NAN),
            gpu_total_pct: Num(f64::NAN),
            cpu_mem_self_bytes: cpu_mem,
            cpu_mem_bytes: cpu_mem,
            gpu_mem_self_bytes: 0,
            gpu_mem_bytes: 0,
        }
    }

    #[test]
    fn every_column_sorts_and_torch_names_are_accepted() {
        let mut ops = vec![
            op("b", 1, 10.0, 100.0, 0),
            op("a", 10, 30.0, 40.0, 5),
            op("c", 2, 20.0, 20.0, 9),
        ];
        let names = |ops: &[OpStat]| ops.iter().map(|o| o.name.clone()).collect::<String>();
        for (sort, want) in [
            ("self-cpu", "acb"),
            ("cpu_time_total", "bac"),
            ("cpu_time", "bca"),
            ("count", "acb"),
            ("self_cpu_memory_usage", "cab"),
            ("name", "abc"),
        ] {
            let s = OpSort::from_str(sort, false).unwrap();
            s.sort(&mut ops);
            assert_eq!(names(&ops), want, "{sort}");
        }
        assert!(OpSort::from_str("bogus", false).is_err());
    }
}
