//! Reading and editing a vLLM container's command line, without I/O.
//!
//! vLLM is started three ways in the pod specs people actually deploy (see `testdata/pods/`):
//! - **exec form**: `command`/`args` lists, e.g. `["vllm", "serve", MODEL, "--port", "8000"]` or
//!   `["python3", "-m", "vllm.entrypoints.openai.api_server"]` plus `args`;
//! - **shell form**: `["/bin/sh", "-c", "vllm serve MODEL --gpu-memory-utilization 0.9 …"]`;
//! - either form with a flag's value taken from the environment: `--gpu-memory-utilization=$(GPU_UTIL)` (Kubernetes
//!   expands `$(VAR)` in exec form) or `$GPU_UTIL` / `${GPU_UTIL}` (the shell expands it).
//!
//! [`set_flag`] replaces every occurrence of a flag in place, in the spelling the user wrote (`--flag value`,
//! `--flag=value`, dashes or underscores), sets the environment variable instead when the value comes from one,
//! and appends the flag only when it is absent — so a second run changes nothing and no flag is ever duplicated.

use k8s_openapi::api::core::v1::{Container, EnvVar};

/// vLLM's default port (`--port`).
pub const DEFAULT_PORT: u16 = 8000;

/// The shells whose `-c` script we edit.
const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "zsh"];

/// Why a flag could not be set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettable(pub String);

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Where the shell script sits, if the container runs one: (in `command`?, index).
fn shell_script(c: &Container) -> Option<(bool, usize)> {
    let command = c.command.as_deref().unwrap_or_default();
    let first = command.first()?;
    if !SHELLS.contains(&basename(first)) {
        return None;
    }
    // `-c`, `-ec`, `-xc`, `-exc`: any short-option cluster that contains `c`.
    let is_c = |s: &String| s.starts_with('-') && !s.starts_with("--") && s.contains('c');
    let pos = command.iter().position(is_c)?;
    if pos + 1 < command.len() {
        Some((true, pos + 1))
    } else if c.args.as_ref().is_some_and(|a| !a.is_empty()) {
        Some((false, 0))
    } else {
        None
    }
}

fn script(c: &Container) -> Option<&str> {
    let (in_command, i) = shell_script(c)?;
    let list = if in_command { &c.command } else { &c.args };
    list.as_ref()?.get(i).map(String::as_str)
}

fn script_mut(c: &mut Container) -> Option<&mut String> {
    let (in_command, i) = shell_script(c)?;
    let list = if in_command { &mut c.command } else { &mut c.args };
    list.as_mut()?.get_mut(i)
}

/// The container's words: exec-form `command` + `args`, or the shell script split on whitespace (quotes are not
/// interpreted; flags and their values in vLLM command lines do not contain spaces).
pub fn words(c: &Container) -> Vec<String> {
    if let Some(s) = script(c) {
        return s.split_whitespace().map(str::to_string).collect();
    }
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

/// Whether `c` runs vLLM's OpenAI server: its command line names `vllm serve` or the `vllm.entrypoints`
/// module, or (no command of its own) its image is a vLLM image whose entrypoint is the server.
pub fn is_vllm(c: &Container) -> bool {
    let w = words(c);
    let runs = w.iter().enumerate().any(|(i, t)| {
        let t = t.trim_matches(|ch| ch == '"' || ch == '\'');
        t.starts_with("vllm.entrypoints.openai")
            || (basename(t) == "vllm" && w.get(i + 1).is_some_and(|n| n == "serve"))
    });
    if runs {
        return true;
    }
    let own_command = c.command.as_ref().is_some_and(|v| !v.is_empty());
    !own_command && image_repository(c).is_some_and(|r| basename(r).contains("vllm"))
}

fn image_repository(c: &Container) -> Option<&str> {
    let image = c.image.as_deref()?;
    let no_digest = image.split('@').next().unwrap_or(image);
    // A tag follows the last ':' unless that ':' belongs to a registry port (then a '/' comes after it).
    Some(match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    })
}

/// vLLM's version from the image tag (`vllm/vllm-openai:v0.11.2` → (0, 11)), only for images whose repository
/// names vLLM (an `llm-d-cuda:v0.5.0` tag is llm-d's version, not vLLM's). `None` where the tag says nothing
/// (`latest`, a digest, a custom image).
pub fn image_version(c: &Container) -> Option<(u32, u32)> {
    let repo = image_repository(c)?;
    if !basename(repo).contains("vllm") {
        return None;
    }
    let image = c.image.as_deref()?;
    let tag = image.split('@').next()?.get(repo.len()..)?.strip_prefix(':')?;
    parse_version(tag)
}

/// `"0.11"`, `"v0.11.2"`, `"0.11.0rc1"` → (0, 11).
pub fn parse_version(s: &str) -> Option<(u32, u32)> {
    let s = s.strip_prefix('v').unwrap_or(s);
    let mut parts = s.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
    Some((major, minor.parse().ok()?))
}

/// The two spellings vLLM's argument parser accepts for a flag: `--kv-cache-memory-bytes` and
/// `--kv_cache_memory_bytes`.
fn spellings(flag: &str) -> [String; 2] {
    [flag.to_string(), flag.replace('-', "_").replacen("__", "--", 1)]
}

/// The value of `flag` in `words` (last occurrence wins, as in argparse). A flag written without a value (the
/// last word, or followed by another `--flag`, which argparse will not take as its value) gives `Some("")`: the
/// flag is there and vLLM would refuse to start, which is not the same as the flag being absent.
pub fn flag_value(words: &[String], flag: &str) -> Option<String> {
    let names = spellings(flag);
    let mut found = None;
    for (i, w) in words.iter().enumerate() {
        for n in &names {
            if w == n {
                found = Some(
                    words
                        .get(i + 1)
                        .filter(|v| !v.starts_with("--"))
                        .cloned()
                        .unwrap_or_default(),
                );
            } else if let Some(v) = w.strip_prefix(n.as_str()).and_then(|r| r.strip_prefix('=')) {
                found = Some(v.to_string());
            }
        }
    }
    found.map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_string())
}

/// The port vLLM listens on: `--port` (a literal, or `$(VAR)` / `${VAR}` / `$VAR` with a literal value in the
/// container's `env`), else vLLM's default. An error says why the port cannot be known: the sidecar must scrape
/// vLLM's real port, and must never take it.
pub fn port(c: &Container) -> Result<u16, String> {
    let Some(value) = flag_value(&words(c), "--port") else {
        return Ok(DEFAULT_PORT);
    };
    if value.is_empty() {
        // Reading the default here would be wrong twice: vLLM refuses to start on a bare --port, and once
        // Tessera appends its own flags the next reading would take one of them as the port.
        return Err("vLLM's --port has no value (vLLM would refuse to start): write --port 8000".into());
    }
    let literal = match env_ref(&value) {
        None => value.clone(),
        Some(name) => {
            let env = c.env.iter().flatten().rev().find(|e| e.name == name);
            match env.and_then(|e| e.value.clone()) {
                Some(v) => v,
                None => {
                    return Err(format!(
                        "vLLM's --port is {value}, and {name} has no literal value in the container's env \
                         (it is {}): give --port a number, or set {name} with `value:`",
                        if env.is_some() {
                            "set from valueFrom"
                        } else {
                            "not set there"
                        }
                    ));
                }
            }
        }
    };
    literal
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("vLLM's --port is {value:?}, not a port number (1-65535)"))
}

/// The model vLLM serves: `--model`, else the word after `serve`.
pub fn model(c: &Container) -> Option<String> {
    let w = words(c);
    if let Some(m) = flag_value(&w, "--model").filter(|m| !m.is_empty()) {
        return Some(m);
    }
    let i = w.iter().position(|t| t == "serve")?;
    w.get(i + 1)
        .filter(|t| !t.starts_with('-'))
        .map(|t| t.trim_matches(|c| c == '"' || c == '\'').to_string())
}

/// The name of the variable a value refers to: `$(VAR)` (Kubernetes), `$VAR` or `${VAR}` (shell).
fn env_ref(value: &str) -> Option<&str> {
    let v = value.trim_matches(|c| c == '"' || c == '\'');
    let name = v
        .strip_prefix("$(")
        .and_then(|r| r.strip_suffix(')'))
        .or_else(|| v.strip_prefix("${").and_then(|r| r.strip_suffix('}')))
        .or_else(|| v.strip_prefix('$'))?;
    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')).then_some(name)
}

fn is_number(s: &str) -> bool {
    s.trim_matches(|c| c == '"' || c == '\'').parse::<f64>().is_ok()
}

/// Sets environment variable `name` of `c` to `value` (replacing a `valueFrom`), appending it when absent.
pub fn set_env(c: &mut Container, name: &str, value: &str) {
    let env = c.env.get_or_insert_with(Vec::new);
    let mut found = false;
    for e in env.iter_mut().filter(|e| e.name == name) {
        e.value = Some(value.to_string());
        e.value_from = None;
        found = true;
    }
    if !found {
        env.push(EnvVar {
            name: name.to_string(),
            value: Some(value.to_string()),
            value_from: None,
        });
    }
}

/// Replaces every occurrence of `flag` in an exec-form list; returns whether one was found. Values that refer
/// to an environment variable are collected in `env_vars` instead of being rewritten.
fn replace_in_list(list: &mut Vec<String>, flag: &str, value: &str, env_vars: &mut Vec<String>) -> bool {
    let names = spellings(flag);
    let mut found = false;
    let mut i = 0;
    while i < list.len() {
        for n in &names {
            if list[i] == *n {
                found = true;
                match list.get_mut(i + 1) {
                    Some(v) if env_ref(v).is_some() => env_vars.extend(env_ref(v).map(str::to_string)),
                    Some(v) if is_number(v) => *v = value.to_string(),
                    // The flag has no value (the next word is another flag or the entry point): give it one.
                    _ => list.insert(i + 1, value.to_string()),
                }
            } else if let Some(old) = list[i].strip_prefix(n.as_str()).and_then(|r| r.strip_prefix('=')) {
                found = true;
                match env_ref(old) {
                    Some(var) => env_vars.push(var.to_string()),
                    None => list[i] = format!("{n}={value}"),
                }
            }
        }
        i += 1;
    }
    found
}

/// Replaces every occurrence of `flag` in a shell script (word by word, keeping the whitespace between words).
fn replace_in_script(script: &str, flag: &str, value: &str, env_vars: &mut Vec<String>) -> (String, bool) {
    let names = spellings(flag);
    let mut out = String::with_capacity(script.len() + 32);
    let mut found = false;
    let mut expect_value = false;
    let mut rest = script;
    while !rest.is_empty() {
        let ws_len = rest.len() - rest.trim_start().len();
        out.push_str(&rest[..ws_len]);
        rest = &rest[ws_len..];
        if rest.is_empty() {
            break;
        }
        let word_len = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let word = &rest[..word_len];
        rest = &rest[word_len..];
        if expect_value {
            expect_value = false;
            if let Some(var) = env_ref(word) {
                env_vars.push(var.to_string());
                out.push_str(word);
                continue;
            }
            if is_number(word) {
                out.push_str(value);
                continue;
            }
            // The flag had no value: give it one, and keep this word as it was.
            out.push_str(value);
            out.push(' ');
        }
        let mut replaced = false;
        for n in &names {
            if word == n {
                found = true;
                expect_value = true;
                out.push_str(word);
                replaced = true;
                break;
            }
            if let Some(old) = word.strip_prefix(n.as_str()).and_then(|r| r.strip_prefix('=')) {
                found = true;
                replaced = true;
                match env_ref(old) {
                    Some(var) => {
                        env_vars.push(var.to_string());
                        out.push_str(word);
                    }
                    None => out.push_str(&format!("{n}={value}")),
                }
                break;
            }
        }
        if !replaced {
            out.push_str(word);
        }
    }
    if expect_value {
        out.push(' ');
        out.push_str(value);
    }
    (out, found)
}

/// Inserts `--flag=value` right after vLLM's entry point in a shell script (`vllm serve`, or the
/// `vllm.entrypoints.openai.api_server` module), so it lands on vLLM's command line whatever follows it.
fn insert_in_script(script: &str, flag: &str, value: &str) -> Option<String> {
    let anchors = ["vllm.entrypoints.openai.api_server", "vllm serve"];
    let (at, anchor) = anchors
        .iter()
        .filter_map(|a| script.find(a).map(|i| (i, *a)))
        .min_by_key(|(i, _)| *i)?;
    let end = at + anchor.len();
    Some(format!("{} {flag}={value}{}", &script[..end], &script[end..]))
}

/// Sets vLLM flag `flag` to `value` on `c` (see the module docs). Errors when the command line cannot be edited
/// safely (a shell script without a recognizable vLLM command).
pub fn set_flag(c: &mut Container, flag: &str, value: &str) -> Result<(), Unsettable> {
    let mut env_vars = Vec::new();
    if shell_script(c).is_some() {
        let Some(s) = script_mut(c) else {
            return Err(Unsettable("the shell script is missing".into()));
        };
        let (next, found) = replace_in_script(s, flag, value, &mut env_vars);
        *s = if found {
            next
        } else {
            insert_in_script(s, flag, value).ok_or_else(|| {
                Unsettable(format!(
                    "{flag} is not set and the shell script has no `vllm serve` or \
                     `vllm.entrypoints.openai.api_server` to add it to"
                ))
            })?
        };
    } else {
        let mut found = false;
        if let Some(cmd) = c.command.as_mut() {
            found |= replace_in_list(cmd, flag, value, &mut env_vars);
        }
        if let Some(args) = c.args.as_mut() {
            found |= replace_in_list(args, flag, value, &mut env_vars);
        }
        if !found {
            c.args
                .get_or_insert_with(Vec::new)
                .push(format!("{flag}={value}"));
        }
    }
    for var in env_vars {
        set_env(c, &var, value);
    }
    Ok(())
}

/// Whether [`set_flag`] could set a flag on `c` (checked before reserving GPU room for it).
pub fn flags_settable(c: &Container) -> bool {
    match script(c) {
        Some(s) => {
            s.contains("vllm serve")
                || s.contains("vllm.entrypoints.openai.api_server")
                || s.contains("--gpu-memory-utilization")
                || s.contains("--gpu_memory_utilization")
        }
        None => shell_script(c).is_none(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn exec(command: &[&str], args: &[&str]) -> Container {
        Container {
            name: "vllm".into(),
            image: Some("vllm/vllm-openai:v0.11.0".into()),
            command: (!command.is_empty()).then(|| command.iter().map(|s| s.to_string()).collect()),
            args: (!args.is_empty()).then(|| args.iter().map(|s| s.to_string()).collect()),
            ..Container::default()
        }
    }

    #[test]
    fn replaces_both_spellings_in_place_and_never_duplicates() {
        let mut c = exec(
            &["vllm", "serve", "m"],
            &["--gpu_memory_utilization", "0.9", "--gpu-memory-utilization=0.8"],
        );
        set_flag(&mut c, "--gpu-memory-utilization", "0.25").unwrap();
        assert_eq!(
            c.args.as_deref().unwrap(),
            [
                "--gpu_memory_utilization",
                "0.25",
                "--gpu-memory-utilization=0.25"
            ]
        );
        let before = c.clone();
        set_flag(&mut c, "--gpu-memory-utilization", "0.25").unwrap();
        assert_eq!(c, before, "idempotent");
        set_flag(&mut c, "--kv-cache-memory-bytes", "1000").unwrap();
        assert_eq!(
            c.args.as_ref().unwrap().last().unwrap(),
            "--kv-cache-memory-bytes=1000"
        );
        set_flag(&mut c, "--kv-cache-memory-bytes", "2000").unwrap();
        assert_eq!(
            c.args
                .as_ref()
                .unwrap()
                .iter()
                .filter(|a| a.starts_with("--kv"))
                .count(),
            1
        );
    }

    #[test]
    fn flags_in_command_are_replaced_there() {
        let mut c = exec(
            &[
                "python3",
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--gpu-memory-utilization",
                "0.9",
            ],
            &["--port", "8080"],
        );
        set_flag(&mut c, "--gpu-memory-utilization", "0.5").unwrap();
        assert_eq!(c.command.as_ref().unwrap()[4], "0.5");
        assert_eq!(c.args.as_deref().unwrap(), ["--port", "8080"]);
        assert_eq!(port(&c), Ok(8080));
    }

    #[test]
    fn shell_scripts_are_edited_word_by_word() {
        let mut c = exec(
            &["/bin/sh", "-c"],
            &["python3 -m vllm.entrypoints.openai.api_server --model /mnt/models\n  --port 8000"],
        );
        assert!(is_vllm(&c));
        assert_eq!(model(&c).as_deref(), Some("/mnt/models"));
        set_flag(&mut c, "--gpu-memory-utilization", "0.3").unwrap();
        assert_eq!(
            c.args.as_ref().unwrap()[0],
            "python3 -m vllm.entrypoints.openai.api_server --gpu-memory-utilization=0.3 --model /mnt/models\n  --port 8000"
        );
        set_flag(&mut c, "--gpu-memory-utilization", "0.4").unwrap();
        assert!(c.args.as_ref().unwrap()[0].contains("--gpu-memory-utilization=0.4 --model"));
        let mut s = exec(
            &[
                "bash",
                "-ec",
                "exec vllm serve m --gpu-memory-utilization 0.9 --port 9000",
            ],
            &[],
        );
        set_flag(&mut s, "--gpu-memory-utilization", "0.2").unwrap();
        assert_eq!(
            s.command.as_ref().unwrap()[2],
            "exec vllm serve m --gpu-memory-utilization 0.2 --port 9000"
        );
        assert_eq!(port(&s), Ok(9000));
        let mut opaque = exec(&["sh", "-c", "/start.sh"], &[]);
        assert!(!flags_settable(&opaque));
        assert!(set_flag(&mut opaque, "--gpu-memory-utilization", "0.2").is_err());
    }

    #[test]
    fn values_from_the_environment_set_the_variable() {
        let mut c = exec(&["vllm", "serve", "m"], &["--gpu-memory-utilization=$(GPU_UTIL)"]);
        c.env = Some(vec![EnvVar {
            name: "GPU_UTIL".into(),
            value: Some("0.9".into()),
            value_from: None,
        }]);
        set_flag(&mut c, "--gpu-memory-utilization", "0.3").unwrap();
        assert_eq!(
            c.args.as_deref().unwrap(),
            ["--gpu-memory-utilization=$(GPU_UTIL)"]
        );
        assert_eq!(c.env.as_ref().unwrap()[0].value.as_deref(), Some("0.3"));
        let mut s = exec(
            &["sh", "-c", "vllm serve m --gpu-memory-utilization ${UTIL}"],
            &[],
        );
        set_flag(&mut s, "--gpu-memory-utilization", "0.3").unwrap();
        assert!(s.command.as_ref().unwrap()[2].ends_with("${UTIL}"));
        assert_eq!(s.env.as_ref().unwrap()[0].name, "UTIL");
    }

    #[test]
    fn versions_come_only_from_vllm_images() {
        let mut c = exec(&[], &[]);
        assert_eq!(image_version(&c), Some((0, 11)));
        c.image = Some("registry:5000/vllm/vllm-openai:v0.7.1".into());
        assert_eq!(image_version(&c), Some((0, 7)));
        c.image = Some("vllm/vllm-openai:latest".into());
        assert_eq!(image_version(&c), None);
        c.image = Some("ghcr.io/llm-d/llm-d-cuda:v0.5.0".into());
        assert_eq!(image_version(&c), None);
        assert_eq!(parse_version("0.11.0rc1"), Some((0, 11)));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn a_port_from_the_environment_is_resolved_or_refused_with_a_reason() {
        use k8s_openapi::api::core::v1::EnvVar;
        let env = |name: &str, value: Option<&str>| EnvVar {
            name: name.into(),
            value: value.map(str::to_string),
            ..EnvVar::default()
        };
        for spelling in [
            &["--port=$(PORT)"][..],
            &["--port", "${PORT}"],
            &["--port", "$PORT"],
        ] {
            let mut c = exec(&["vllm", "serve", "m"], spelling);
            c.env = Some(vec![env("PORT", Some("8081"))]);
            assert_eq!(port(&c), Ok(8081), "{spelling:?}");
            c.env = Some(vec![env("PORT", None)]);
            let err = port(&c).expect_err("valueFrom is unknowable at admission");
            assert!(err.contains("PORT") && err.contains("valueFrom"), "{err}");
            c.env = None;
            let err = port(&c).expect_err("an unset variable");
            assert!(err.contains("not set there"), "{err}");
        }
        let c = exec(&["vllm", "serve", "m"], &["--port", "http"]);
        assert!(port(&c).expect_err("not a number").contains("not a port number"));
        assert_eq!(port(&exec(&["vllm", "serve", "m"], &[])), Ok(DEFAULT_PORT));
    }

    /// Found by the property test in CI: a bare `--port` read as "the default" at admission, and after Tessera
    /// appended `--gpu-memory-utilization=0.3` the second reading took that flag as the port.
    #[test]
    fn a_port_flag_without_a_value_is_refused_before_and_after_flags_are_appended() {
        for args in [&["--port"][..], &["--port", "--gpu-memory-utilization=0.3"]] {
            let err = port(&exec(&["vllm", "serve", "m"], args)).expect_err("no value");
            assert!(
                err.contains("no value") && err.contains("--port 8000"),
                "{args:?}: {err}"
            );
        }
        assert_eq!(
            model(&exec(&["vllm", "serve", "m"], &["--model"])).as_deref(),
            Some("m")
        );
    }
}
