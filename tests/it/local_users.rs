//! What another local user can try against a root job's trace files, as that user: symlinks
//! planted in a shared trace directory (mode 0777, not sticky) at the names the trace writer uses.
//! Each test runs in a fresh child process, so the names the writer would have used before it drew
//! random ones (a per-process sequence number, the pid) are the ones planted.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kinetrace::export::writer::{KinetoSink, TraceDir};
use kinetrace::{Sink, TraceMeta, WindowInfo};
use kinetrace_test_support::process::{in_child, is_child, run};
use kinetrace_test_support::users::other_user;

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// `@{host}@{pid namespace}@{pid}.tmp`: the tail of an unfinished file's name, as the writer
/// makes it (and as an attacker reads it off the node).
fn owner_tail(pid: u32) -> String {
    let host: String = kinetrace::export::default_worker_name()
        .rsplit_once('_')
        .map(|(h, _)| h.to_string())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let ns: String = std::fs::read_link("/proc/self/ns/pid")
        .unwrap()
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    format!("@{host}@{ns}@{pid}.tmp")
}

/// A root job writes its trace into a shared directory where another user planted symlinks to a
/// 0600 file of root's at the unfinished file's old, predictable names, and made a subdirectory
/// name a symlink to a directory of root's: the trace is written, under a name of its own, and
/// nothing is written through a link; the trace meant for the linked subdirectory is refused.
#[test]
fn a_symlink_planted_in_a_shared_trace_dir_is_never_written_through() {
    let test = "local_users::a_symlink_planted_in_a_shared_trace_dir_is_never_written_through";
    if is_child(test) {
        let shared = PathBuf::from(var("_KINETRACE_TEST_SHARED"));
        let victim = PathBuf::from(var("_KINETRACE_TEST_VICTIM"));
        let secret = victim.join("secret");
        let uid: u32 = var("_KINETRACE_TEST_OTHER_UID").parse().unwrap();
        let gid: u32 = var("_KINETRACE_TEST_OTHER_GID").parse().unwrap();
        let other = kinetrace_test_support::users::OtherUser { uid, gid };
        // Planted by the other user, for the names this process's first sinks would have had.
        let tail = owner_tail(std::process::id());
        let mut plant = other.command("sh");
        let mut script = String::from("set -e; cd \"$1\"; ln -s \"$2\" sub;");
        for seq in 0..4 {
            script.push_str(&format!(" ln -s \"$3\" '.w.0.{seq}.pt.trace.json{tail}';"));
        }
        plant
            .args(["-c", &script, "sh"])
            .args([&shared, &victim, &secret])
            .current_dir(&shared);
        let o = run(plant);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

        let mut target = TraceDir::new(&shared);
        target.worker = "w".into();
        let sink = KinetoSink::create(target, &WindowInfo::default()).unwrap();
        let out = Box::new(sink).finish(&TraceMeta::default()).unwrap();
        let path = out.path.unwrap();
        assert_eq!(path.parent(), Some(shared.as_path()));
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .contains("traceEvents"));
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "secret",
            "the trace was written through a planted temp name"
        );

        let mut into_link = TraceDir::new(shared.join("sub"));
        into_link.worker = "w".into();
        let e = KinetoSink::create(into_link, &WindowInfo::default())
            .err()
            .expect("a directory through another user's symlink is refused");
        assert!(e.to_string().contains("is a symlink owned by uid"), "{e}");

        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret");
        let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let in_victim: Vec<_> = std::fs::read_dir(&victim).unwrap().collect();
        assert_eq!(
            in_victim.len(),
            1,
            "written into root's directory: {in_victim:?}"
        );
        return;
    }
    let Some(other) = other_user(test) else {
        return;
    };
    let shared = other.world_dir();
    let victim = tempfile::tempdir().unwrap();
    let secret = victim.path().join("secret");
    std::fs::write(&secret, "secret").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (uid, gid) = (other.uid.to_string(), other.gid.to_string());
    in_child(
        test,
        &[
            ("_KINETRACE_TEST_SHARED", path_str(shared.path())),
            ("_KINETRACE_TEST_VICTIM", path_str(victim.path())),
            ("_KINETRACE_TEST_OTHER_UID", &uid),
            ("_KINETRACE_TEST_OTHER_GID", &gid),
        ],
        || unreachable!("the child runs above"),
    );
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}
