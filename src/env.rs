//! The launcher's view of a distributed job: `RANK`, `LOCAL_RANK` and `WORLD_SIZE`, as torchrun,
//! `torch.distributed.launch`, Slurm wrappers and MPI launchers for PyTorch set them.
//!
//! This is the one parser of those variables: [`ProfilerBuilder::start`](crate::ProfilerBuilder::start)
//! uses it for the rank and world size it does not get explicitly, and the injected-process
//! runtime (`kinetrace-agent`) uses it to select ranks. Only the variables consulted are parsed:
//! the rank is `RANK`, else `LOCAL_RANK` (a malformed `LOCAL_RANK` next to a valid `RANK` is not
//! read). A malformed value is an error naming the variable, the value and the accepted form;
//! an empty one counts as unset.

use std::fmt;

/// A launcher variable that is set but malformed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError {
    /// The variable.
    pub key: &'static str,
    /// Its value.
    pub value: String,
}

impl EnvError {
    /// The accepted form, as the message states it.
    pub fn expected(&self) -> &'static str {
        if self.key == "WORLD_SIZE" {
            "an integer >= 1 such as 8"
        } else {
            "an integer >= 0 such as 0"
        }
    }
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.key == "WORLD_SIZE" {
            "a world size"
        } else {
            "a rank"
        };
        write!(
            f,
            "{}: `{}` is not {what}; expected {}",
            self.key,
            self.value,
            self.expected()
        )
    }
}

impl std::error::Error for EnvError {}

/// Where this process sits in a distributed job, per its environment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Distributed {
    /// `RANK`, else `LOCAL_RANK` (`None`: neither is set).
    pub rank: Option<u32>,
    /// `WORLD_SIZE` (`None`: unset).
    pub world_size: Option<u32>,
}

impl Distributed {
    /// Reads this process's environment.
    pub fn from_env() -> Result<Distributed, EnvError> {
        Distributed::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads environment pairs (the last of a repeated key wins, as in a process environment).
    pub fn from_vars(vars: &[(String, String)]) -> Result<Distributed, EnvError> {
        Distributed::from_lookup(|k| {
            vars.iter()
                .rev()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
        })
    }

    /// Reads the variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Distributed, EnvError> {
        let read = |key: &'static str, min: u32| -> Result<Option<u32>, EnvError> {
            let Some(raw) = get(key) else {
                return Ok(None);
            };
            let v = raw.trim();
            if v.is_empty() {
                return Ok(None);
            }
            match v.parse::<u32>() {
                Ok(n) if n >= min => Ok(Some(n)),
                _ => Err(EnvError { key, value: raw }),
            }
        };
        let rank = match read("RANK", 0)? {
            Some(r) => Some(r),
            None => read("LOCAL_RANK", 0)?,
        };
        Ok(Distributed {
            rank,
            world_size: read("WORLD_SIZE", 1)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn rank_is_rank_then_local_rank() {
        let d = Distributed::from_vars(&vars(&[("RANK", "8"), ("LOCAL_RANK", "0")])).unwrap();
        assert_eq!(d.rank, Some(8));
        let d = Distributed::from_vars(&vars(&[("LOCAL_RANK", " 3 ")])).unwrap();
        assert_eq!(d.rank, Some(3));
        let d = Distributed::from_vars(&vars(&[("RANK", ""), ("WORLD_SIZE", "16")])).unwrap();
        assert_eq!(
            d,
            Distributed {
                rank: None,
                world_size: Some(16)
            }
        );
        assert_eq!(Distributed::from_vars(&[]).unwrap(), Distributed::default());
        // Only the variable consulted is parsed.
        let d = Distributed::from_vars(&vars(&[("RANK", "2"), ("LOCAL_RANK", "gpu0")])).unwrap();
        assert_eq!(d.rank, Some(2));
    }

    #[test]
    fn a_malformed_value_names_the_variable_and_the_form() {
        let e = Distributed::from_vars(&vars(&[("RANK", "first")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RANK: `first` is not a rank; expected an integer >= 0 such as 0"
        );
        let e = Distributed::from_vars(&vars(&[("LOCAL_RANK", "-1")])).unwrap_err();
        assert_eq!(e.key, "LOCAL_RANK");
        let e =
            Distributed::from_vars(&vars(&[("RANK", "0"), ("WORLD_SIZE", "eight")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "WORLD_SIZE: `eight` is not a world size; expected an integer >= 1 such as 8"
        );
        let e = Distributed::from_vars(&vars(&[("WORLD_SIZE", "0")])).unwrap_err();
        assert_eq!(e.key, "WORLD_SIZE");
    }
}
