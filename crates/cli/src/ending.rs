//! What `record` says about how the job ended, in its last lines: interrupted, terminated or
//! killed by a signal (or a shell's exit code for one), at which step, and what that left.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// How the job ended, when that is worth saying: by a signal, or with a shell's code for one
/// (128 + the signal, what a launcher script returns when its job was interrupted).
pub fn describe(status: ExitStatus) -> Option<String> {
    if let Some(sig) = status.signal() {
        return Some(format!("was {}", by_signal(sig)));
    }
    let code = status.code()?;
    let sig = code - 128;
    matches!(sig, 1 | 2 | 15)
        .then(|| format!("exited with code {code}, as a job {} does", by_signal(sig)))
}

/// `interrupted (SIGINT)`, `terminated (SIGTERM)`, ...
fn by_signal(sig: i32) -> String {
    let name = kinetrace_agent::signal_name(sig);
    match sig {
        2 => format!("interrupted ({name})"),
        15 => format!("terminated ({name})"),
        1 => format!("hung up on ({name})"),
        9 => format!("killed ({name})"),
        _ => format!("ended by {name}"),
    }
}

/// The highest `ProfilerStep#N` over `traces` (read in full, streaming), if any has one.
pub fn last_step(traces: &[PathBuf]) -> Option<i64> {
    traces.iter().filter_map(|t| last_step_of(t)).max()
}

fn last_step_of(trace: &Path) -> Option<i64> {
    let mut last: Option<i64> = None;
    let mut numbers: Vec<Option<Option<i64>>> = Vec::new();
    kinetrace::export::reader::for_each_event(trace, |e, strings| {
        let i = e.name.0 as usize;
        if numbers.len() <= i {
            numbers.resize(i + 1, None);
        }
        let n =
            *numbers[i].get_or_insert_with(|| kinetrace_analysis::steps::step_number(&strings[i]));
        if let Some(n) = n {
            last = Some(last.map_or(n, |l| l.max(n)));
        }
    })
    .ok()?;
    last
}

/// The line before the listing of traces: `kinetrace: the job was interrupted (SIGINT) in step 11;
/// 1 trace of what was recorded in DIR:`, or the plain `kinetrace: 1 trace(s) in DIR:`.
pub fn listing_header(ended: Option<&str>, traces: &[PathBuf], dir: &Path) -> String {
    let n = traces.len();
    match ended {
        Some(how) => {
            let step = last_step(traces)
                .map(|s| format!(" in step {s}"))
                .unwrap_or_default();
            format!(
                "kinetrace: the job {how}{step}; {n} trace(s) of what was recorded in {}:",
                dir.display()
            )
        }
        None => format!("kinetrace: {n} trace(s) in {}:", dir.display()),
    }
}

/// The line when no trace was written.
pub fn no_traces(ended: Option<&str>, removed: usize, dir: &Path) -> String {
    match (ended, removed) {
        (Some(how), 0) => format!(
            "kinetrace: no traces in {}: the job {how} before any process started profiling (none had initialised CUDA or reported a step, or none was selected: see --ranks, the messages above or --log)",
            dir.display()
        ),
        (Some(how), _) => format!(
            "kinetrace: no traces in {}: the job {how}, and its profiled process(es) ended before their trace was saved (see the messages above or --log)",
            dir.display()
        ),
        (None, 0) => format!(
            "kinetrace: no traces in {}: no process initialised CUDA or reported a step, or none was selected (see --ranks, the messages above or --log)",
            dir.display()
        ),
        (None, _) => format!(
            "kinetrace: no traces in {}: the profiled process(es) ended before their trace was saved (killed, or past the exit budget; see the messages above or --log)",
            dir.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_say_the_signal_or_the_shell_code_for_one() {
        let signalled = |s: i32| ExitStatus::from_raw(s);
        let exited = |c: i32| ExitStatus::from_raw(c << 8);
        assert_eq!(
            describe(signalled(2)).as_deref(),
            Some("was interrupted (SIGINT)")
        );
        assert_eq!(
            describe(signalled(15)).as_deref(),
            Some("was terminated (SIGTERM)")
        );
        assert_eq!(
            describe(signalled(9)).as_deref(),
            Some("was killed (SIGKILL)")
        );
        assert_eq!(
            describe(exited(130)).as_deref(),
            Some("exited with code 130, as a job interrupted (SIGINT) does")
        );
        assert_eq!(describe(exited(0)), None);
        assert_eq!(describe(exited(5)), None);
        assert_eq!(describe(exited(137)), None);
    }
}
