//! Value parsers (each returns what is wrong; the caller adds the value and the accepted form),
//! the glob matcher of `KINETRACE_STEP_NVTX`, and typo suggestions for unknown keys.

use std::path::PathBuf;
use std::time::Duration;

use kinetrace_core::activity::{ActivitySet, ActivityType};
use kinetrace_core::schedule::Schedule;
use kinetrace_core::session::CaptureLength;

use super::Ranks;

/// The known spelling closest to `name` (case-insensitive), if it is close enough to be a typo.
pub fn suggest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for k in known {
        let d = edit_distance(&name.to_ascii_uppercase(), &k.to_ascii_uppercase());
        if best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, k));
        }
    }
    best.filter(|(d, k)| *d <= (k.len() / 3).max(2))
        .map(|(_, k)| k)
}

pub(super) fn unknown_message<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
    match suggest(name, known) {
        Some(k) => format!("is not a kinetrace setting; did you mean {k}? (see docs/config.md)"),
        None => "is not a kinetrace setting (see docs/config.md for the list)".to_string(),
    }
}

pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

// Value parsers: each returns what is wrong (the caller adds the value and the accepted form).

pub(super) fn nonempty(v: &str) -> Result<&str, String> {
    if v.is_empty() {
        Err("is empty".into())
    } else {
        Ok(v)
    }
}

pub(super) fn path(v: &str) -> Result<PathBuf, String> {
    nonempty(v).map(PathBuf::from)
}

pub(super) fn u64_(v: &str) -> Result<u64, String> {
    nonempty(v)?;
    if v.starts_with('-') {
        return Err("is negative".into());
    }
    v.parse::<u64>().map_err(|_| "is not an integer".into())
}

pub(super) fn pos_u32(v: &str) -> Result<u32, String> {
    let n = u64_(v)?;
    if n == 0 {
        return Err("is 0".into());
    }
    u32::try_from(n).map_err(|_| "is too large".into())
}

pub(super) fn boolean(v: &str) -> Result<bool, String> {
    match v {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err("is not a boolean".into()),
    }
}

/// `500ms`, `2s`, `1m`.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().ok()?;
    match unit.trim() {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" | "min" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

pub(super) fn duration(v: &str, zero_ok: bool) -> Result<Duration, String> {
    nonempty(v)?;
    let d = parse_duration(v).ok_or_else(|| {
        if v.bytes().all(|b| b.is_ascii_digit()) {
            "has no unit".to_string()
        } else {
            "is not a duration".to_string()
        }
    })?;
    if d.is_zero() && !zero_ok {
        return Err("is zero".into());
    }
    Ok(d)
}

pub(super) fn step_range(v: &str) -> Result<(u64, u64), String> {
    let (a, b) = v.split_once('-').ok_or("is not FIRST-LAST")?;
    let (a, b) = (u64_(a.trim())?, u64_(b.trim())?);
    if b < a {
        return Err("ends before it starts".into());
    }
    Schedule::step_range(a, b).map_err(|e| e.message)?;
    Ok((a, b))
}

pub(super) fn schedule(v: &str) -> Result<Schedule, String> {
    let mut pairs = Vec::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, val) = part
            .split_once('=')
            .ok_or_else(|| format!("has `{part}`, which is not key=N"))?;
        pairs.push((k.trim(), val.trim()));
    }
    Schedule::from_pairs(pairs).map_err(|e| format!("has `{}` that {}", e.field, e.message))
}

/// Kineto `cat` names kinetrace accepts in `ACTIVITY_TYPES` but does not record.
const KINETO_OTHER_TYPES: [&str; 9] = [
    "python_function",
    "external_correlation",
    "gpu_user_annotation",
    "cuda_event",
    "cuda_profiler_range",
    "collective_comm",
    "mtia_runtime",
    "privateuse1_runtime",
    "hpu_op",
];

pub(super) fn activities(v: &str) -> Result<ActivitySet, String> {
    let mut set = ActivitySet::empty();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let name = name.to_ascii_lowercase();
        if let Some(t) = ActivityType::ALL.iter().find(|t| t.kineto_name() == name) {
            set = set.with(*t);
        } else if !KINETO_OTHER_TYPES.contains(&name.as_str()) {
            let names = ActivityType::ALL.iter().map(|t| t.kineto_name());
            return Err(match suggest(&name, names) {
                Some(k) => format!("has `{name}`, which is no activity type; did you mean {k}?"),
                None => format!("has `{name}`, which is no activity type"),
            });
        }
    }
    if set.is_empty() {
        return Err("selects nothing kinetrace records".into());
    }
    Ok(set)
}

pub(super) fn step_pattern(v: &str) -> Result<String, String> {
    nonempty(v)?;
    if v.chars().any(char::is_control) {
        return Err("has a control character".into());
    }
    Ok(v.to_string())
}

/// Whether `text` matches the glob `pattern` as a whole: `*` matches any run of characters
/// (including none), `?` exactly one, everything else itself (case-sensitive). Linear in practice:
/// backtracks only to the last `*`.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || (p[pi] != '*' && p[pi] == t[ti])) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

pub(super) fn ranks(v: &str) -> Result<Ranks, String> {
    if v == "all" {
        return Ok(Ranks(vec![(0, u32::MAX)]));
    }
    let mut out = Vec::new();
    for part in v.split(',').map(str::trim) {
        let parse = |s: &str| -> Result<u32, String> {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("has `{}`, which is not a rank", s.trim()))
        };
        let range = match part.split_once('-') {
            Some((a, b)) => (parse(a)?, parse(b)?),
            None => {
                let r = parse(part)?;
                (r, r)
            }
        };
        if range.1 < range.0 {
            return Err(format!("has `{part}`, which ends before it starts"));
        }
        out.push(range);
    }
    Ok(Ranks(out))
}

pub(super) fn signal(v: &str) -> Result<Option<CaptureLength>, String> {
    match v {
        "off" | "0" | "false" => return Ok(None),
        "on" | "1" | "true" => {
            return Ok(Some(CaptureLength::Duration(Duration::from_millis(500))))
        }
        _ => {}
    }
    if let Some(n) = v.strip_suffix("steps").or_else(|| v.strip_suffix("step")) {
        return pos_u32(n.trim()).map(|n| Some(CaptureLength::Steps(n)));
    }
    duration(v, false).map(|d| Some(CaptureLength::Duration(d)))
}
