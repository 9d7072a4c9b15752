//! `distributedInfo` as a job states it: the JSON object torch.profiler builds from
//! `torch.distributed` (`backend`, `rank`, `world_size`, `pg_count`, `pg_config`,
//! `nccl_version`), read into [`DistributedInfo`] so the head writes it in one known form.

use kinetrace_core::{DistributedInfo, ProcessGroupConfig};
use serde_json::{Map, Value};

/// Reads a `distributedInfo` object. `rank` is required; the other keys are optional, and keys
/// torch.profiler does not write are ignored. The error names the key and what was expected.
pub fn parse_distributed_info(json: &str) -> Result<DistributedInfo, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let o = v
        .as_object()
        .ok_or("not a JSON object (such as {\"rank\": 0})")?;
    let rank = u32_of(o, "rank")?.ok_or("`rank` is missing")?;
    let pg_config = match o.get("pg_config") {
        None | Some(Value::Null) => None,
        Some(Value::Array(groups)) => Some(
            groups
                .iter()
                .enumerate()
                .map(|(i, g)| group(g).map_err(|e| format!("pg_config[{i}]: {e}")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err("`pg_config` is not an array".into()),
    };
    Ok(DistributedInfo {
        backend: str_of(o, "backend")?,
        rank,
        world_size: u32_of(o, "world_size")?,
        pg_count: u64_of(o, "pg_count")?,
        pg_config,
        nccl_version: str_of(o, "nccl_version")?,
    })
}

fn group(g: &Value) -> Result<ProcessGroupConfig, String> {
    let o = g.as_object().ok_or("not an object")?;
    let ranks = match o.get("ranks") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(r)) => r
            .iter()
            .map(|x| x.as_u64().ok_or("`ranks` holds a non-integer"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`ranks` is not an array".into()),
    };
    Ok(ProcessGroupConfig {
        pg_name: str_of(o, "pg_name")?.unwrap_or_default(),
        pg_desc: str_of(o, "pg_desc")?.unwrap_or_default(),
        backend_config: str_of(o, "backend_config")?.unwrap_or_default(),
        pg_size: u64_of(o, "pg_size")?.unwrap_or(ranks.len() as u64),
        ranks,
    })
}

fn str_of(o: &Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("`{k}` is not a string")),
    }
}

fn u64_of(o: &Map<String, Value>, k: &str) -> Result<Option<u64>, String> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`{k}` is not an integer >= 0")),
    }
}

fn u32_of(o: &Map<String, Value>, k: &str) -> Result<Option<u32>, String> {
    match u64_of(o, k)? {
        None => Ok(None),
        Some(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| format!("`{k}` is too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_profilers_object_reads_back_whole() {
        // What torch.profiler's _get_distributed_info gives for a 2-rank gloo job.
        let text = r#"{"backend": "gloo", "rank": 1, "world_size": 2, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
            "backend_config": "cpu:gloo,cuda:gloo", "pg_size": 2, "ranks": [0, 1]}]}"#;
        let d = parse_distributed_info(text).unwrap();
        assert_eq!(d.backend.as_deref(), Some("gloo"));
        assert_eq!((d.rank, d.world_size, d.pg_count), (1, Some(2), Some(1)));
        let g = &d.pg_config.as_ref().unwrap()[0];
        assert_eq!(
            (
                g.pg_name.as_str(),
                g.pg_desc.as_str(),
                g.backend_config.as_str()
            ),
            ("0", "default_pg", "cpu:gloo,cuda:gloo")
        );
        assert_eq!((g.pg_size, g.ranks.clone()), (2, vec![0, 1]));
        assert_eq!(d.nccl_version, None);
    }

    #[test]
    fn bad_objects_say_what_is_wrong() {
        let e = |t: &str| parse_distributed_info(t).unwrap_err();
        assert!(e("[1]").contains("not a JSON object"));
        assert!(e(r#"{"world_size": 2}"#).contains("`rank` is missing"));
        assert!(e(r#"{"rank": -1}"#).contains("`rank` is not an integer"));
        assert!(e(r#"{"rank": 0, "backend": 3}"#).contains("`backend` is not a string"));
        assert!(e(r#"{"rank": 0, "pg_config": [{"ranks": ["a"]}]}"#)
            .contains("pg_config[0]: `ranks` holds a non-integer"));
        assert!(e("{").contains("not JSON"));
    }
}
