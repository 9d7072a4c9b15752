//! DEVICE records (Device4 prefix → [`DeviceProperties`]) and CONTEXT records (context → device).

use std::mem::{offset_of, size_of};

use kinetrace_core::activity::*;

use super::{base, Decoded, Decoder, Rec, DEVICES_MAX, MAP_MAX};

impl Decoder {
    #[inline]
    pub(super) fn device(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityDevice4>() {
            return Decoded::TooShort;
        }
        macro_rules! f {
            ($f:ident) => {
                r.u32(off!(CUpti_ActivityDevice4.$f))
            };
        }
        let id = f!(id);
        let warp = f!(numThreadsPerWarp);
        let props = DeviceProperties {
            id,
            name: self
                .names
                .string(r.u64(off!(CUpti_ActivityDevice4.name)) as usize)
                .unwrap_or_default(),
            total_global_mem: r.u64(off!(CUpti_ActivityDevice4.globalMemorySize)),
            compute_major: f!(computeCapabilityMajor),
            compute_minor: f!(computeCapabilityMinor),
            max_threads_per_block: f!(maxThreadsPerBlock),
            max_threads_per_multiprocessor: f!(maxWarpsPerMultiprocessor).saturating_mul(warp),
            regs_per_block: f!(maxRegistersPerBlock),
            warp_size: warp,
            shared_mem_per_block: f!(maxSharedMemoryPerBlock) as u64,
            num_sms: f!(numMultiprocessors),
            regs_per_multiprocessor: Some(f!(maxRegistersPerMultiprocessor)),
            // Not in any DEVICE record layout (11.8 – 13.5).
            shared_mem_per_block_optin: None,
            shared_mem_per_multiprocessor: Some(f!(maxSharedMemoryPerMultiprocessor) as u64),
        };
        self.stats.devices += 1;
        if let Some(d) = self.devices.iter_mut().find(|d| d.id == id) {
            *d = props;
        } else if self.devices.len() < DEVICES_MAX {
            self.devices.push(props);
            self.devices.sort_by_key(|d| d.id);
        }
        Decoded::Device(id)
    }

    #[inline]
    pub(super) fn context(&mut self, r: Rec<'_>) -> Decoded {
        if r.0.len() < size_of::<base::CUpti_ActivityContext>() {
            return Decoded::TooShort;
        }
        let context = r.u32(off!(CUpti_ActivityContext.contextId));
        let device = r.u32(off!(CUpti_ActivityContext.deviceId));
        self.stats.contexts += 1;
        // Authoritative: overrides what GPU records suggested.
        if self.context_device.len() >= MAP_MAX && !self.context_device.contains_key(&context) {
            self.context_device.clear();
        }
        self.context_device.insert(context, device);
        self.last_context = (context, device);
        Decoded::Context { context, device }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{bytes, decoder};
    use super::super::*;
    use crate::kinds;
    use crate::version::Release;
    use kinetrace_cupti_sys::{v12, v13};

    macro_rules! device {
        ($t:ty, $id:expr) => {{
            let mut d: $t = Default::default();
            d.kind = kinds::DEVICE;
            d.id = $id;
            d.name = c"Test GPU".as_ptr();
            d.globalMemorySize = 1 << 34;
            d.numThreadsPerWarp = 32;
            d.numMultiprocessors = 80;
            d.maxWarpsPerMultiprocessor = 48;
            d.maxSharedMemoryPerMultiprocessor = 102_400;
            d.maxRegistersPerMultiprocessor = 65_536;
            d.maxRegistersPerBlock = 32_768;
            d.maxSharedMemoryPerBlock = 49_152;
            d.maxThreadsPerBlock = 1024;
            d.computeCapabilityMajor = 8;
            d.computeCapabilityMinor = 6;
            bytes(&d)
        }};
    }

    #[test]
    fn device_records_of_every_layout_become_device_properties() {
        let cases = [
            (Release::V11_8, device!(v12::CUpti_ActivityDevice4, 1)),
            (Release::V12_9, device!(v12::CUpti_ActivityDevice5, 1)),
            (Release::V13_5, device!(v13::CUpti_ActivityDevice6, 1)),
        ];
        for (release, rec) in cases {
            assert_eq!(
                Some(rec.len()),
                release.layout().size_of_kind(kinds::DEVICE)
            );
            let mut d = decoder(release);
            assert_eq!(
                d.decode(&device!(v12::CUpti_ActivityDevice4, 3)),
                Decoded::Device(3)
            );
            assert_eq!(d.decode(&rec), Decoded::Device(1));
            let p = d.device_properties();
            assert_eq!(
                p.iter().map(|p| p.id).collect::<Vec<_>>(),
                [1, 3],
                "sorted by id"
            );
            assert_eq!(
                p[0],
                DeviceProperties {
                    id: 1,
                    name: "Test GPU".into(),
                    total_global_mem: 1 << 34,
                    compute_major: 8,
                    compute_minor: 6,
                    max_threads_per_block: 1024,
                    max_threads_per_multiprocessor: 1536,
                    regs_per_block: 32_768,
                    warp_size: 32,
                    shared_mem_per_block: 49_152,
                    num_sms: 80,
                    regs_per_multiprocessor: Some(65_536),
                    shared_mem_per_block_optin: None,
                    shared_mem_per_multiprocessor: Some(102_400),
                },
                "{release}"
            );
            // The same device again replaces, never duplicates.
            d.decode(&rec);
            assert_eq!(d.device_properties().len(), 2);
            // Only the Device4 record (id 3) is off-size, and only for releases past 12.1.
            assert_eq!(
                d.stats().size_mismatch,
                u64::from(release != Release::V11_8),
                "{release}"
            );
            assert_eq!(d.decode(&rec[..100]), Decoded::TooShort);
        }
    }

    #[test]
    fn context_records_override_what_gpu_records_suggested() {
        let mut d = decoder(Release::V13_5);
        let k = bytes(&v13::CUpti_ActivityKernel13 {
            kind: kinds::CONCURRENT_KERNEL,
            deviceId: 0,
            contextId: 4,
            ..Default::default()
        });
        d.decode(&k);
        assert_eq!(d.device_of_context(4), Some(0));
        let c = bytes(&v13::CUpti_ActivityContext4 {
            kind: kinds::CONTEXT,
            contextId: 4,
            deviceId: 1,
            ..Default::default()
        });
        assert_eq!(
            d.decode(&c),
            Decoded::Context {
                context: 4,
                device: 1
            }
        );
        assert_eq!(d.device_of_context(4), Some(1));
        assert_eq!(d.decode(&c[..12]), Decoded::TooShort);
        let old = bytes(&v12::CUpti_ActivityContext {
            kind: kinds::CONTEXT,
            contextId: 8,
            deviceId: 3,
            ..Default::default()
        });
        assert_eq!(old.len(), 16);
        assert_eq!(
            d.decode(&old),
            Decoded::Context {
                context: 8,
                device: 3
            }
        );
    }
}
