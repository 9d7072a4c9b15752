//! Kernel, marker and device names: C-string pointers inside records, turned into [`NameId`]s.

use std::ffi::CStr;

use kinetrace_core::intern::{intern_bytes, NameId};

use super::IntMap;

/// Turns C-string pointers inside records into [`NameId`]s, caching by pointer (CUPTI keeps kernel
/// names alive for the life of the process, and the same kernel always has the same pointer).
pub struct CStrNames {
    last: (usize, NameId),
    cache: IntMap<usize, NameId>,
}

/// Most pointers the name cache holds before it starts over.
const NAME_CACHE_MAX: usize = 1 << 16;

impl CStrNames {
    /// A cache that dereferences name pointers found in records.
    ///
    /// # Safety
    /// Every record later passed to a [`Decoder`](super::Decoder) owning this cache must hold, in its name fields
    /// (kernel `name`, marker `name`/`domain`, device `name`), either null or a pointer to a
    /// NUL-terminated string
    /// that stays valid and unchanged for as long as the same pointer value can appear again. CUPTI
    /// guarantees this for its records; synthetic buffers must point at `'static` strings.
    pub unsafe fn new() -> CStrNames {
        CStrNames {
            last: (0, NameId::OVERFLOW),
            cache: IntMap::default(),
        }
    }

    #[inline]
    pub(super) fn get(&mut self, ptr: usize) -> Option<NameId> {
        if ptr == 0 {
            return None;
        }
        if self.last.0 == ptr {
            return Some(self.last.1);
        }
        let id = match self.cache.get(&ptr) {
            Some(id) => *id,
            None => {
                if self.cache.len() >= NAME_CACHE_MAX {
                    self.cache.clear();
                }
                // SAFETY: `new`'s contract: non-null name pointers in records are valid C strings.
                let bytes = unsafe { CStr::from_ptr(ptr as *const core::ffi::c_char) }.to_bytes();
                let id = intern_bytes(bytes);
                self.cache.insert(ptr, id);
                id
            }
        };
        self.last = (ptr, id);
        Some(id)
    }

    /// The string at `ptr` (uncached: DEVICE records are rare).
    pub(super) fn string(&self, ptr: usize) -> Option<String> {
        if ptr == 0 {
            return None;
        }
        // SAFETY: `new`'s contract: non-null name pointers in records are valid C strings.
        let c = unsafe { CStr::from_ptr(ptr as *const core::ffi::c_char) };
        Some(c.to_string_lossy().into_owned())
    }
}
