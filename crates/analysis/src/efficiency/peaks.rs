//! Vendor peaks as data: one row per GPU (per device as the trace sees it: an MI250X's two
//! GCDs are two devices), each number from the vendor's datasheet (dense, no sparsity), and the
//! matching of a trace's `deviceProperties` to a row. `docs/analyze.md`'s peaks table is
//! generated from [`DEVICES`].

use serde::{Deserialize, Serialize};

use super::models::{Category, Precision};

/// Peaks of one device, TFLOP/s (dense) and TB/s (decimal). 0 where the device has no such unit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DevicePeaks {
    /// The device's name in reports.
    pub name: &'static str,
    /// Vector fp64.
    pub fp64: f64,
    /// Matrix (tensor core) fp64.
    pub fp64_matrix: f64,
    /// Vector fp32 (what elementwise ops, reductions and norms run at).
    pub fp32: f64,
    /// Matrix fp32 (AMD's matrix cores; on NVIDIA the vector figure: without TF32, PyTorch's
    /// default for matmuls, fp32 GEMMs run on the CUDA cores).
    pub fp32_matrix: f64,
    /// TF32 tensor cores.
    pub tf32: f64,
    /// fp16 matrix.
    pub fp16: f64,
    /// bf16 matrix.
    pub bf16: f64,
    /// fp8 matrix.
    pub fp8: f64,
    /// int8 matrix (TOP/s).
    pub int8: f64,
    /// fp4 matrix.
    pub fp4: f64,
    /// HBM bandwidth, TB/s.
    pub bandwidth: f64,
}

/// How a row recognises a device in `deviceProperties`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceMatch {
    /// Lower-case substrings of `name`, any of which matches.
    pub names: &'static [&'static str],
    /// Lower-case substrings that rule the row out (`h100 nvl` is not an H100 SXM).
    pub not: &'static [&'static str],
    /// `numSms` (SMs or CUs) the device must have, when the row needs it (ROCm traces may call
    /// every AMD GPU "AMD Radeon Graphics").
    pub sms: Option<i64>,
    /// `totalGlobalMem` range, GiB.
    pub mem_gib: (f64, f64),
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Device {
    pub matches: DeviceMatch,
    pub peaks: DevicePeaks,
    /// The datasheet the numbers come from.
    pub source: &'static str,
}

const fn peaks(
    name: &'static str,
    [fp64, fp64_matrix, fp32, fp32_matrix, tf32]: [f64; 5],
    [fp16, bf16, fp8, int8, fp4]: [f64; 5],
    bandwidth: f64,
) -> DevicePeaks {
    DevicePeaks {
        name,
        fp64,
        fp64_matrix,
        fp32,
        fp32_matrix,
        tf32,
        fp16,
        bf16,
        fp8,
        int8,
        fp4,
        bandwidth,
    }
}

const ANY_MEM: (f64, f64) = (0.0, f64::INFINITY);

/// The GPUs users run, most specific row first. `[fp64, fp64 matrix, fp32, fp32 matrix, tf32]`,
/// `[fp16, bf16, fp8, int8, fp4]`, bandwidth.
pub(crate) const DEVICES: &[Device] = &[
    // https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
    // (V100 SXM2: 7.8 FP64, 15.7 FP32, 125 tensor; 900 GB/s. PCIe: 7 / 14 / 112; 900 GB/s.)
    Device {
        matches: DeviceMatch {
            names: &["v100-sxm", "v100 sxm"],
            not: &["v100s"],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA V100 SXM2",
            [7.8, 7.8, 15.7, 15.7, 0.0],
            [125.0, 0.0, 0.0, 0.0, 0.0],
            0.9,
        ),
        source: "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    },
    Device {
        matches: DeviceMatch {
            names: &["v100"],
            not: &["v100s"],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA V100 PCIe",
            [7.0, 7.0, 14.0, 14.0, 0.0],
            [112.0, 0.0, 0.0, 0.0, 0.0],
            0.9,
        ),
        source: "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
    },
    // https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    // (9.7 FP64, 19.5 FP64 tensor, 19.5 FP32, 156 TF32, 312 BF16/FP16, 624 INT8; 40GB
    // 1,555 GB/s, 80GB PCIe 1,935 GB/s, 80GB SXM 2,039 GB/s.) `A100-PG509-200` is Meta's
    // name for the SXM4 40GB board (the traces in `../shared/traces`).
    Device {
        matches: DeviceMatch {
            names: &["a100"],
            not: &[],
            sms: None,
            mem_gib: (0.0, 48.0),
        },
        peaks: peaks(
            "NVIDIA A100 40GB",
            [9.7, 19.5, 19.5, 19.5, 156.0],
            [312.0, 312.0, 0.0, 624.0, 0.0],
            1.555,
        ),
        source: "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    },
    Device {
        matches: DeviceMatch {
            names: &["a100 80gb pcie", "a100-pcie-80gb"],
            not: &[],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA A100 80GB PCIe",
            [9.7, 19.5, 19.5, 19.5, 156.0],
            [312.0, 312.0, 0.0, 624.0, 0.0],
            1.935,
        ),
        source: "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    },
    Device {
        matches: DeviceMatch {
            names: &["a100"],
            not: &["pcie"],
            sms: None,
            mem_gib: (48.0, f64::INFINITY),
        },
        peaks: peaks(
            "NVIDIA A100 80GB SXM",
            [9.7, 19.5, 19.5, 19.5, 156.0],
            [312.0, 312.0, 0.0, 624.0, 0.0],
            2.039,
        ),
        source: "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    },
    // https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    // (H100 SXM: 34 FP64, 67 FP64 tensor, 67 FP32, 989 TF32*, 1,979 BF16/FP16*, 3,958 FP8* and
    // INT8*, 3.35 TB/s; PCIe: 26 / 51 / 51 / 756* / 1,513* / 3,026*, 2 TB/s; NVL: 30 / 60 / 60 /
    // 835* / 1,671* / 3,341*, 3.9 TB/s; * with sparsity, halved here.)
    Device {
        matches: DeviceMatch {
            names: &["h100 nvl"],
            not: &[],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA H100 NVL",
            [30.0, 60.0, 60.0, 60.0, 417.5],
            [835.5, 835.5, 1670.5, 1670.5, 0.0],
            3.9,
        ),
        source: "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    },
    Device {
        matches: DeviceMatch {
            names: &["h100 pcie", "h100-pcie"],
            not: &[],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA H100 PCIe",
            [26.0, 51.0, 51.0, 51.0, 378.0],
            [756.5, 756.5, 1513.0, 1513.0, 0.0],
            2.0,
        ),
        source: "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    },
    Device {
        matches: DeviceMatch {
            names: &["h100"],
            not: &[],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA H100 SXM",
            [34.0, 67.0, 67.0, 67.0, 494.5],
            [989.5, 989.5, 1979.0, 1979.0, 0.0],
            3.35,
        ),
        source: "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    },
    // https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 34 FP64, 67 FP64 tensor, 67
    // FP32, 989 TF32*, 1,979 BF16/FP16*, 3,958 FP8*/INT8*, 4.8 TB/s; H200 NVL: 30 / 60 / 60 /
    // 835* / 1,671* / 3,341*, 4.8 TB/s; * with sparsity, halved here.)
    Device {
        matches: DeviceMatch {
            names: &["h200 nvl"],
            not: &["gh200"],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA H200 NVL",
            [30.0, 60.0, 60.0, 60.0, 417.5],
            [835.5, 835.5, 1670.5, 1670.5, 0.0],
            4.8,
        ),
        source: "https://www.nvidia.com/en-us/data-center/h200/",
    },
    Device {
        matches: DeviceMatch {
            names: &["h200"],
            not: &["gh200"],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA H200 SXM",
            [34.0, 67.0, 67.0, 67.0, 494.5],
            [989.5, 989.5, 1979.0, 1979.0, 0.0],
            4.8,
        ),
        source: "https://www.nvidia.com/en-us/data-center/h200/",
    },
    // https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, 8 GPUs: 296 FP64/FP64 tensor,
    // 600 FP32, 18 PF TF32*, 36 PF FP16/BF16*, 72 PF FP8*/INT8*, 144 PF FP4*, 64 TB/s; per GPU
    // one eighth, * with sparsity halved here.)
    Device {
        matches: DeviceMatch {
            names: &["b200"],
            not: &["gb200"],
            sms: None,
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "NVIDIA B200",
            [37.0, 37.0, 75.0, 75.0, 1125.0],
            [2250.0, 2250.0, 4500.0, 4500.0, 9000.0],
            8.0,
        ),
        source: "https://www.nvidia.com/en-us/data-center/hgx/",
    },
    // https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html (per OAM, two
    // GCDs: 47.9 FP64 vector, 95.7 FP64 matrix, 47.9 FP32 vector, 95.7 FP32 matrix, 383 FP16/BF16,
    // 383 INT8, 3.2768 TB/s, 220 CUs). Each GCD is one device in a trace: halved here.
    Device {
        matches: DeviceMatch {
            names: &["mi250x", "amd radeon graphics", "amd instinct"],
            not: &[],
            sms: Some(110),
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "AMD MI250X (one GCD)",
            [23.95, 47.85, 23.95, 47.85, 0.0],
            [191.5, 191.5, 0.0, 191.5, 0.0],
            1.6384,
        ),
        source: "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
    },
    // https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html (per OAM, two GCDs:
    // 45.3 FP64 vector, 90.5 FP64 matrix, 45.3 FP32 vector, 90.5 FP32 matrix, 362.1 FP16/BF16,
    // 362.1 INT8, 3.2768 TB/s, 208 CUs). Halved per GCD. The ROCm 6.2 trace in `../shared/traces`
    // names it "AMD Radeon Graphics" with 104 CUs.
    Device {
        matches: DeviceMatch {
            names: &["mi250", "amd radeon graphics", "amd instinct"],
            not: &[],
            sms: Some(104),
            mem_gib: ANY_MEM,
        },
        peaks: peaks(
            "AMD MI250 (one GCD)",
            [22.65, 45.25, 22.65, 45.25, 0.0],
            [181.05, 181.05, 0.0, 181.05, 0.0],
            1.6384,
        ),
        source: "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html",
    },
    // https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (81.7 FP64
    // vector, 163.4 FP64 matrix, 163.4 FP32 vector and matrix, 653.7 TF32, 1,307.4 FP16/BF16,
    // 2,614.9 FP8/INT8, 5.3 TB/s, 192 GB, 304 CUs).
    Device {
        matches: DeviceMatch {
            names: &["mi300x", "amd radeon graphics", "amd instinct"],
            not: &[],
            sms: Some(304),
            mem_gib: (150.0, 200.0),
        },
        peaks: peaks(
            "AMD MI300X",
            [81.7, 163.4, 163.4, 163.4, 653.7],
            [1307.4, 1307.4, 2614.9, 2614.9, 0.0],
            5.3,
        ),
        source: "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
    },
    // https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html (the MI300X's
    // compute, 6 TB/s, 256 GB, 304 CUs).
    Device {
        matches: DeviceMatch {
            names: &["mi325x", "amd radeon graphics", "amd instinct"],
            not: &[],
            sms: Some(304),
            mem_gib: (200.0, 270.0),
        },
        peaks: peaks(
            "AMD MI325X",
            [81.7, 163.4, 163.4, 163.4, 653.7],
            [1307.4, 1307.4, 2614.9, 2614.9, 0.0],
            6.0,
        ),
        source: "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html",
    },
    // https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html (78.6 FP64
    // vector and matrix, 157.3 FP32 vector and matrix, 2.5 PF FP16/BF16, 5.0 PF FP8/INT8,
    // 10 PF MXFP4, 8 TB/s, 288 GB, 256 CUs; no TF32).
    Device {
        matches: DeviceMatch {
            names: &["mi355x", "amd radeon graphics", "amd instinct"],
            not: &[],
            sms: Some(256),
            mem_gib: (250.0, 300.0),
        },
        peaks: peaks(
            "AMD MI355X",
            [78.6, 78.6, 157.3, 157.3, 0.0],
            [2516.6, 2516.6, 5033.2, 5033.2, 10066.3],
            8.0,
        ),
        source: "https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html",
    },
];

/// The fields of one `deviceProperties` entry the matching reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub(crate) struct DeviceProps {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "totalGlobalMem")]
    pub total_mem: Option<f64>,
    #[serde(default, rename = "numSms")]
    pub sms: Option<i64>,
}

/// The table row of a device, if one matches.
pub(crate) fn match_device(d: &DeviceProps) -> Option<&'static Device> {
    let name = d.name.to_ascii_lowercase();
    let gib = d.total_mem.map(|b| b / (1u64 << 30) as f64);
    DEVICES.iter().find(|row| {
        let m = &row.matches;
        m.names.iter().any(|n| name.contains(n))
            && !m.not.iter().any(|n| name.contains(n))
            && m.sms.is_none_or(|s| d.sms == Some(s))
            && gib.is_none_or(|g| g >= m.mem_gib.0 && g < m.mem_gib.1)
    })
}

/// The compute peak an op runs at, TFLOP/s: matrix units for GEMMs, convolutions and
/// attention in their input precision; the vector fp32 (fp64) peak for everything else (PyTorch
/// computes elementwise ops, reductions and norms in fp32 whatever the storage dtype). 0 when the
/// device has no such unit.
pub(crate) fn compute_peak(p: &DevicePeaks, category: Category, precision: Precision) -> f64 {
    if !category.is_matrix() {
        return if precision == Precision::Fp64 {
            p.fp64
        } else {
            p.fp32
        };
    }
    match precision {
        Precision::Fp64 => p.fp64_matrix,
        Precision::Fp32 | Precision::Int => p.fp32_matrix,
        Precision::Fp16 => p.fp16,
        Precision::Bf16 => p.bf16,
        Precision::Fp8 => p.fp8,
        Precision::Int8 => p.int8,
        Precision::Fp4 => p.fp4,
    }
}
