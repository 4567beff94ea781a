//! Every missing field of a scenario at once. serde stops at the first missing field, so a file with three gaps
//! took three runs to fix; this asks serde again with a stand-in for each field it names, until it names no more.
//!
//! Bounded: at most [`MAX_FIELDS`] fields and four stand-ins per field (a duration-like string, a number, a list,
//! a mapping: whichever the field's type takes). Only the list of names is kept; the stand-ins never reach a run.

use serde::de::DeserializeOwned;
use serde_yaml::{Mapping, Value};

/// The most missing fields reported for one file.
pub const MAX_FIELDS: usize = 32;

/// The fields `T` needs that `value` lacks, as `path.field` (`models[0].slo_ttft`), in the order serde meets them;
/// empty when none is missing (or the first error is of another kind).
pub fn missing<T: DeserializeOwned>(value: &Value) -> Vec<String> {
    let mut v = value.clone();
    let mut found: Vec<String> = Vec::new();
    // The field being stood in for, and which stand-in it has now.
    let mut trying: Option<(String, usize)> = None;
    // Top-level fields stood in for as a whole because a field inside them took no stand-in.
    let mut given_up: Vec<String> = Vec::new();
    for _ in 0..MAX_FIELDS * STAND_INS.len() {
        // Through text, not `from_value`: only the text parser's errors carry the field's path.
        let Ok(text) = serde_yaml::to_string(&v) else {
            break;
        };
        let Err(e) = serde_yaml::from_str::<T>(&text) else {
            break;
        };
        let message = e.to_string();
        if let Some(field) = missing_field(&message) {
            if found.len() == MAX_FIELDS {
                break;
            }
            found.push(field.clone());
            if !stand_in(&mut v, &field, 0) {
                break;
            }
            trying = Some((field, 0));
            continue;
        }
        // Another error: the stand-in may be of the wrong type for its field; try the next one.
        match trying.take() {
            Some((field, k)) if k + 1 < STAND_INS.len() && names(&message, &field) => {
                if !stand_in(&mut v, &field, k + 1) {
                    break;
                }
                trying = Some((field, k + 1));
            }
            // No stand-in fits a nested field (an enum's tag, say): stand in for the top-level field holding it
            // instead, so the fields beside it (`gpu` after `models`) are still found.
            Some((field, _)) if root(&field) != field && !given_up.iter().any(|g| g == root(&field)) => {
                let r = root(&field).to_owned();
                given_up.push(r.clone());
                if !stand_in(&mut v, &r, 0) {
                    break;
                }
                trying = Some((r, 0));
            }
            _ => break,
        }
    }
    // A field inside one that was missing is the stand-in's gap, not the file's: `traffic`, not `traffic.trace`.
    let all = found.clone();
    found.retain(|f| !all.iter().any(|p| f.starts_with(&format!("{p}."))));
    found
}

/// The top-level field a path starts in (`models` of `models[0].traffic`).
fn root(path: &str) -> &str {
    path.split(['.', '[']).next().unwrap_or(path)
}

const STAND_INS: [fn() -> Value; 4] = [
    || Value::String("1s".into()),
    || Value::Number(1.into()),
    || Value::Sequence(Vec::new()),
    || Value::Mapping(Mapping::new()),
];

/// `models[0].trace: missing field `kind` at line 3 column 5` → `models[0].trace.kind`.
fn missing_field(message: &str) -> Option<String> {
    let (before, after) = message.split_once("missing field `")?;
    let field = after.split('`').next()?;
    let path = before.trim_end().strip_suffix(':').unwrap_or("").trim();
    Some(if path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    })
}

/// Whether an error message is about `field` (its path prefix names it).
fn names(message: &str, field: &str) -> bool {
    message.starts_with(&format!("{field}:")) || message.starts_with(&format!("{field} "))
}

/// Sets `path` (dots and `[i]`) in `v` to stand-in `k`; false where the path does not lead to a mapping.
fn stand_in(v: &mut Value, path: &str, k: usize) -> bool {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return false };
    let mut at = v;
    for part in parts {
        let (key, index) = match part.split_once('[') {
            Some((key, rest)) => (key, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        let Some(next) = at.get_mut(key) else { return false };
        at = match index {
            Some(i) => match next.get_mut(i) {
                Some(x) => x,
                None => return false,
            },
            None => next,
        };
    }
    match at.as_mapping_mut() {
        Some(m) => {
            m.insert(Value::String(last.to_owned()), STAND_INS[k]());
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Model {
        name: String,
        #[serde(with = "humantime_serde")]
        slo: std::time::Duration,
        max: u32,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct File {
        name: String,
        count: u32,
        models: Vec<Model>,
    }

    #[test]
    fn every_missing_field_in_one_answer_whatever_its_type() {
        let v: Value = serde_yaml::from_str("models:\n  - {name: a}\n  - {slo: 2s, max: 3}\n").expect("yaml");
        assert_eq!(
            missing::<File>(&v),
            // In serde's order: a nested struct's gaps where it ends, the file's at its end.
            [
                "models[0].slo",
                "models[0].max",
                "models[1].name",
                "name",
                "count"
            ]
        );
        let whole: Value = serde_yaml::from_str("{name: x, count: 1, models: []}").expect("yaml");
        assert!(missing::<File>(&whole).is_empty());
        let wrong: Value = serde_yaml::from_str("{name: x, count: many, models: []}").expect("yaml");
        assert!(
            missing::<File>(&wrong).is_empty(),
            "another error is not a missing field"
        );
    }
}
