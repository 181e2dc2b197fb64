//! Byte counts for people.

use std::fmt;

/// Shows a byte count in B, KiB, MiB or GiB (one or two decimals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const K: f64 = 1024.0;
        let b = self.0 as f64;
        if b >= K * K * K {
            write!(f, "{:.2} GiB", b / (K * K * K))
        } else if b >= K * K {
            write!(f, "{:.1} MiB", b / (K * K))
        } else if b >= K {
            write!(f, "{:.1} KiB", b / K)
        } else {
            write!(f, "{} B", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HumanBytes;

    #[test]
    fn units() {
        assert_eq!(HumanBytes(512).to_string(), "512 B");
        assert_eq!(HumanBytes(1536).to_string(), "1.5 KiB");
        assert_eq!(HumanBytes(3 << 20).to_string(), "3.0 MiB");
        assert_eq!(HumanBytes(5 << 30).to_string(), "5.00 GiB");
    }
}
