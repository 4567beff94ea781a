//! The pod's annotations as the kubelet writes them into a downward-API file (`fieldRef: metadata.annotations`):
//! one `key="value"` per line, the value quoted the way Go's `strconv.Quote` quotes it. Pure and tested; the
//! sidecar reads [`tessera_core::sleep::command::ANNOTATION`] from it.

use std::collections::BTreeMap;

/// A line of the file that is not `key="value"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of the annotations file is not key=\"value\": {why}")]
pub struct BadLine {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub why: &'static str,
}

/// Parses the whole file into key → value.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, BadLine> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why| BadLine { line: i + 1, why };
        let (key, quoted) = line.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let value = unquote(quoted).ok_or_else(|| bad("the value is not a Go-quoted string"))?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// Undoes Go's `strconv.Quote`: `"…"` with `\\`, `\"`, `\n`, `\t`, `\r`, `\a`, `\b`, `\f`, `\v`, `\xHH`,
/// `\uHHHH`, `\UHHHHHHHH` and octal `\NNN` escapes. `None` when it is not such a string.
pub fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut bytes: Vec<u8> = Vec::new();
    let mut chars = inner.chars();
    // Go quotes invalid UTF-8 as \xHH bytes: they are collected and decoded together.
    let flush = |bytes: &mut Vec<u8>, out: &mut String| {
        if !bytes.is_empty() {
            out.push_str(&String::from_utf8_lossy(bytes));
            bytes.clear();
        }
    };
    while let Some(c) = chars.next() {
        if c == '"' {
            return None;
        }
        if c != '\\' {
            flush(&mut bytes, &mut out);
            out.push(c);
            continue;
        }
        let hex = |chars: &mut std::str::Chars<'_>, n: usize| -> Option<u32> {
            let digits: String = chars.by_ref().take(n).collect();
            (digits.len() == n).then_some(())?;
            u32::from_str_radix(&digits, 16).ok()
        };
        match chars.next()? {
            'x' => {
                bytes.push(u8::try_from(hex(&mut chars, 2)?).ok()?);
                continue;
            }
            d @ '0'..='7' => {
                let rest: String = chars.by_ref().take(2).collect();
                let n = u32::from_str_radix(&format!("{d}{rest}"), 8).ok()?;
                bytes.push(u8::try_from(n).ok()?);
                continue;
            }
            e => {
                flush(&mut bytes, &mut out);
                out.push(match e {
                    '\\' => '\\',
                    '"' => '"',
                    '\'' => '\'',
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'v' => '\u{b}',
                    'u' => char::from_u32(hex(&mut chars, 4)?)?,
                    'U' => char::from_u32(hex(&mut chars, 8)?)?,
                    _ => return None,
                });
            }
        }
    }
    flush(&mut bytes, &mut out);
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_kubelet_format() {
        let file = "kubernetes.io/config.seen=\"2026-11-27T10:00:00.000000000Z\"\n\
                    tessera.dev/rest=\"sleep level=1 since=1764240000000\"\n\
                    note=\"say \\\"hi\\\"\\n\\ttab \\u00e9 \\xc3\\xa9 \\101\"\n";
        let m = parse(file).unwrap();
        assert_eq!(m["tessera.dev/rest"], "sleep level=1 since=1764240000000");
        assert_eq!(m["note"], "say \"hi\"\n\ttab é é A");
        assert_eq!(m.len(), 3);
        assert_eq!(parse("").unwrap().len(), 0);
    }

    #[test]
    fn names_a_bad_line() {
        assert_eq!(
            parse("a=\"1\"\nb=2\n"),
            Err(BadLine {
                line: 2,
                why: "the value is not a Go-quoted string"
            })
        );
        assert_eq!(parse("novalue").unwrap_err().why, "no `=`");
        for bad in [
            "\"unterminated",
            "\"bad \\q escape\"",
            "\"inner \" quote\"",
            "\"\\x4\"",
        ] {
            assert_eq!(unquote(bad), None, "{bad}");
        }
    }
}
