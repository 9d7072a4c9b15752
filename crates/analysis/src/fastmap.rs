//! A hash map for the per-event maps of one rank (correlation ids, thread ids, interned names):
//! the standard map with a multiplicative (Fx-style) hasher instead of SipHash, which the profile
//! of `analyze` on a 35 MB rank showed at about 5 % of the run. Keys come from local trace files,
//! so DoS resistance buys nothing here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// [`HashMap`] with [`FxHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The rustc / Firefox hash: rotate, xor a word, multiply.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes its control bits from the top of the hash, which the multiply fills.
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_apart() {
        let mut m: FastMap<i64, i64> = FastMap::default();
        for i in -1000..1000 {
            m.insert(i * 4096, i);
        }
        assert_eq!(m.len(), 2000);
        assert!((-1000..1000).all(|i| m[&(i * 4096)] == i));
        let mut s: FastMap<&str, u8> = FastMap::default();
        s.insert("a", 1);
        s.insert("a\0", 2);
        assert_eq!((s["a"], s["a\0"]), (1, 2));
    }
}
