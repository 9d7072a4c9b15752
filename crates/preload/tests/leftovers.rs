//! What a killed job leaves (its spool, temporary traces, control socket) is removed by the next
//! kinetrace process, however short it runs, and never what a live process is still writing,
//! whichever pid namespace the processes share. The stand-in job is `examples/fake_train.rs`
//! under the shim; each test has its own trace root, control directory and log.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use kinetrace_agent::control;

/// Files of a process carry its worker name, `{host}_{pid}`.
fn owned_by(pid: u32) -> impl Fn(&PathBuf) -> bool {
    let tag = format!("_{pid}.");
    move |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().contains(&tag))
    }
}

fn socket_of_exists(w: &World, pid: u32) -> bool {
    control::list_sockets(&w.ctl).iter().any(|(p, _)| *p == pid)
}

/// Whether a missing prerequisite must fail the test (`CI=true`).
fn strict() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

#[test]
fn five_short_runs_after_a_killed_job_remove_its_spool_and_socket() {
    let w = World::new();
    // A: recording the whole run, killed while its spool and socket exist.
    let ready = w.tmp.path().join("a-ready");
    let mut c = w.preloaded(
        &w.train,
        &[
            "100000",
            "--cuda",
            "--sleep-ms",
            "20",
            "--ready-file",
            ready.to_str().unwrap(),
        ],
    );
    c.env("KINETRACE_WHOLE_RUN", "1");
    let mut a = Job::spawn(c).show(&w.log);
    let a_pid: u32 = a.wait_for_file(&ready).trim().parse().unwrap();
    a.wait_until("A's spool and socket", |_| {
        w.leftovers().iter().any(owned_by(a_pid)) && socket_of_exists(&w, a_pid)
    });
    // SAFETY: (test) killing our own child.
    assert_eq!(unsafe { libc::kill(a_pid as i32, libc::SIGKILL) }, 0);
    a.wait();
    assert!(w.leftovers().iter().any(owned_by(a_pid)));

    // A short run whose removal cannot finish in time (held back longer than any test waits on a
    // process): exit does not wait for it past its bound; it says so, and the files stay.
    let short = |delay_ms: &str| {
        let mut c = w.preloaded(&w.train, &["0", "--cuda"]);
        c.env("_KINETRACE_TEST_CLEANUP_DELAY_MS", delay_ms);
        let o = run(c);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    };
    short("120000");
    assert!(
        w.log_text()
            .contains("the removal of files killed processes left was not over at exit"),
        "log:\n{}",
        w.log_text()
    );
    assert!(w.leftovers().iter().any(owned_by(a_pid)) && socket_of_exists(&w, a_pid));

    // Five short runs (CUDA, no step, exit: nothing to save), one after the other, each ending
    // before its removal would on its own (held back 200 ms, as on a slow shared file system):
    // exit lets it finish.
    for _ in 0..5 {
        short("200");
    }
    assert!(
        !w.leftovers().iter().any(owned_by(a_pid)) && !socket_of_exists(&w, a_pid),
        "A's files outlived five runs: {:?}, sockets {:?}; log:\n{}",
        w.leftovers(),
        control::list_sockets(&w.ctl),
        w.log_text()
    );
    let said: Vec<String> = w
        .log_text()
        .lines()
        .filter(|l| l.contains("removed 2 file(s) that killed processes"))
        .map(String::from)
        .collect();
    assert_eq!(said.len(), 1, "log:\n{}", w.log_text());
}

/// `unshare --pid --fork`, checked to work here; `None` (one line) where the test may skip.
fn unshare_works(test: &str) -> Option<()> {
    let o = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .output();
    let why = match o {
        Ok(o) if o.status.success() => return Some(()),
        Ok(o) => format!(
            "`unshare --pid --fork true` failed: {}",
            text(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run unshare: {e}"),
    };
    assert!(
        !strict(),
        "{test}: {why} (a new pid namespace needs root; CI=true: failing, not skipping)"
    );
    eprintln!("{test}: SKIPPED: {why}");
    None
}

/// In a new pid namespace (`unshare --pid --fork`, keeping the host's `/proc`): A records and
/// lives, B starts, cleans up and exits, then A is killed. `$1` = fake_train, `$2` = A's ready
/// file, `$3` = the file that lets B start, `$4` = B's ready file.
const IN_NAMESPACE: &str = r#"
train=$1
# The next pid in this namespace is one the host's /proc does not show: looking A up there
# (as a cleanup reading /proc/<pid> would) finds no process although A lives.
while :; do
    true & p=$!
    wait $p
    [ -e /proc/$((p + 1)) ] || break
done
# Only A and B get the shim ($5): a preloaded `sleep` of the loop below would run a cleanup of
# its own and could take the decoy before B does.
LD_PRELOAD="$5" "$train" 100000 --cuda --sleep-ms 20 --ready-file "$2" &
a=$!
while [ ! -e "$3" ]; do sleep 0.05; done
LD_PRELOAD="$5" "$train" 3 --cuda --sleep-ms 100 --ready-file "$4"
echo "B exited with $?"
kill -9 $a
wait $a
"#;

#[test]
fn a_live_process_in_a_pid_namespace_without_its_own_proc_keeps_its_files() {
    let test = "a_live_process_in_a_pid_namespace_without_its_own_proc_keeps_its_files";
    if unshare_works(test).is_none() {
        return;
    }
    let w = World::new();
    let (a_ready, go, b_ready) = (
        w.tmp.path().join("a-ready"),
        w.tmp.path().join("go"),
        w.tmp.path().join("b-ready"),
    );
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let mut c = w.command(
        "unshare",
        &[
            "--pid",
            "--fork",
            "sh",
            "-c",
            IN_NAMESPACE,
            "sh",
            w.train.to_str().unwrap(),
            &arg(&a_ready),
            &arg(&go),
            &arg(&b_ready),
            w.shim.to_str().unwrap(),
        ],
    );
    c.env("KINETRACE_WHOLE_RUN", "1");
    let mut job = Job::spawn(c).show(&w.log);
    let a_pid: u32 = job.wait_for_file(&a_ready).trim().parse().unwrap();
    job.wait_until("A's spool", |_| w.leftovers().iter().any(owned_by(a_pid)));
    // A file of a process of this namespace that is gone, for B to remove (so B's cleanup is seen
    // to have run): `…@{host}@{pid namespace}@{pid}.tmp`, as A's own names it.
    let spool = w.leftovers().into_iter().find(owned_by(a_pid)).unwrap();
    let name = spool.file_name().unwrap().to_string_lossy().into_owned();
    let here = name
        .split_once('@')
        .and_then(|(_, o)| o.rsplit_once('@'))
        .map(|(h, _)| h.to_string())
        .unwrap();
    // No pid namespace made for a test holds this many processes.
    let dead = 4_000_000;
    let decoy = w
        .out
        .join(format!(".decoy_{dead}.0.events@{here}@{dead}.tmp"));
    std::fs::write(&decoy, "").unwrap();
    std::fs::write(&go, "").unwrap();
    let out = job.wait();
    assert!(
        text(&out.stdout).contains("B exited with 0"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let b_pid: u32 = std::fs::read_to_string(&b_ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let log = w.log_text();
    assert!(
        log.contains(&format!("kinetrace[{b_pid}]: removed 1 file(s)")) && !decoy.exists(),
        "B's cleanup ran and removed the dead process's file; log:\n{log}"
    );
    assert!(
        spool.exists(),
        "B removed the spool of A, which was alive; log:\n{log}"
    );
}
