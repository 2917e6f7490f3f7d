//! FNV-1a 64-bit hashing over explicitly encoded bytes.
//!
//! The encoding is fixed (little-endian integers, `f64` bit patterns,
//! length-prefixed sequences), so a hash is the same on every run and
//! platform.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Incremental FNV-1a 64 hasher with canonical encoders.
#[derive(Debug, Clone)]
pub(crate) struct Fnv1a64 {
    state: u64,
}

impl Default for Fnv1a64 {
    fn default() -> Self {
        Self {
            state: OFFSET_BASIS,
        }
    }
}

impl Fnv1a64 {
    pub(crate) fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.state ^= u64::from(b);
            self.state = self.state.wrapping_mul(PRIME);
        }
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    pub(crate) fn f64(&mut self, v: f64) {
        // Fold -0.0 into 0.0 so equal values hash equally.
        let v = if v == 0.0 { 0.0 } else { v };
        self.u64(v.to_bits());
    }

    pub(crate) fn bool(&mut self, v: bool) {
        self.bytes(&[u8::from(v)]);
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes(s.as_bytes());
    }

    pub(crate) fn u32s(&mut self, vs: &[u32]) {
        self.u64(vs.len() as u64);
        for &v in vs {
            self.bytes(&v.to_le_bytes());
        }
    }

    pub(crate) fn u64s(&mut self, vs: &[u64]) {
        self.u64(vs.len() as u64);
        for &v in vs {
            self.u64(v);
        }
    }

    pub(crate) fn f64s(&mut self, vs: &[f64]) {
        self.u64(vs.len() as u64);
        for &v in vs {
            self.f64(v);
        }
    }

    pub(crate) fn bools(&mut self, vs: &[bool]) {
        self.u64(vs.len() as u64);
        for &v in vs {
            self.bool(v);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.state
    }

    /// The hash as 16 lowercase hex digits.
    pub(crate) fn hex(&self) -> String {
        format!("{:016x}", self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(data: &[u8]) -> u64 {
        let mut h = Fnv1a64::default();
        h.bytes(data);
        h.finish()
    }

    #[test]
    fn known_vectors() {
        assert_eq!(of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(of(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hex_is_sixteen_lowercase_digits() {
        let mut h = Fnv1a64::default();
        h.bytes(b"a");
        assert_eq!(h.hex(), "af63dc4c8601ec8c");
        let mut z = Fnv1a64::default();
        z.u64(0);
        assert_eq!(z.hex().len(), 16);
    }

    #[test]
    fn sequences_are_length_prefixed() {
        let mut a = Fnv1a64::default();
        a.u32s(&[1]);
        a.u32s(&[]);
        let mut b = Fnv1a64::default();
        b.u32s(&[]);
        b.u32s(&[1]);
        assert_ne!(a.finish(), b.finish());
    }

    #[test]
    fn negative_zero_hashes_like_zero() {
        let mut a = Fnv1a64::default();
        a.f64(0.0);
        let mut b = Fnv1a64::default();
        b.f64(-0.0);
        assert_eq!(a.finish(), b.finish());
    }
}
