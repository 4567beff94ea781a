//! Byte sizes on the command line and in the environment, one parser for every role: `16MiB`, `16Mi`, `16 MiB`,
//! `1.5GiB`, `16MB` / `16M` (decimal, 16,000,000) or a plain byte count. Kubernetes writes `Mi` and `Gi`, vLLM and
//! most tools `MiB` and `GB`: both are taken, case-insensitively, by the `bytesize` crate.

/// A byte count from `s`, with the accepted forms in the error.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty: give a byte size such as 16MiB, 16Mi, 16MB or 16777216".to_owned());
    }
    if t.starts_with('-') {
        return Err(format!(
            "{s:?} is negative: give a byte size such as 16MiB, 16Mi, 16MB or 16777216"
        ));
    }
    t.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|_| {
            format!(
                "{s:?} is not a byte size: give a number with an optional unit (B, KiB/Ki, MiB/Mi, GiB/Gi, TiB/Ti \
                 are powers of 1024; KB/K, MB/M, GB/G, TB/T powers of 1000), e.g. 16MiB or 16777216"
            )
        })
}

/// [`parse_bytes`], refusing zero (a budget of nothing would refuse everything).
pub fn parse_bytes_nonzero(s: &str) -> Result<u64, String> {
    match parse_bytes(s)? {
        0 => Err(format!(
            "{s:?} is zero bytes: this budget must hold at least one byte"
        )),
        n => Ok(n),
    }
}

/// [`parse_bytes`] for a `usize` (a clap `value_parser`).
pub fn parse_bytes_usize(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("{s:?} is more bytes than this machine can address"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::parse_bytes;

    #[test]
    fn binary_and_decimal_units_in_either_spelling() {
        const MI: u64 = 1024 * 1024;
        for (s, want) in [
            ("16777216", 16 * MI),
            ("16MiB", 16 * MI),
            ("16Mi", 16 * MI),
            ("16 MiB", 16 * MI),
            ("16mib", 16 * MI),
            ("16MB", 16_000_000),
            ("16M", 16_000_000),
            ("1.5GiB", 3 * 512 * MI),
            ("256Ki", 256 * 1024),
            ("8 GB", 8_000_000_000),
            (" 42 ", 42),
        ] {
            assert_eq!(parse_bytes(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn what_is_not_a_size_says_what_is() {
        for s in ["", "-1", "16 parsecs", "MiB", "16MiBs", "1e9"] {
            let e = parse_bytes(s).unwrap_err();
            assert!(e.contains("16MiB"), "{s}: {e}");
        }
    }
}
