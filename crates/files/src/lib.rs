/*!
Every file kinetrace creates goes through this crate, so that no other local user can steer where
it lands. kinetrace often runs as root on nodes shared with other users' jobs, and writes into
directories those users may be able to write to (a group-shared trace directory, `/tmp`): a
symlink planted at a predictable name, or a directory swapped for a symlink between a check and a
write, would otherwise make the job write or replace a file of the attacker's choosing.

The design decision: a directory is opened once, as a file descriptor, by a walk that opens one
component at a time with `O_NOFOLLOW|O_DIRECTORY` ([`Dir`]); everything after that is relative to
that descriptor (`openat`, `renameat2`), so what was checked is what is written into, whatever
happens to the path meanwhile. Files are made as temporary files with `O_CREAT|O_EXCL|O_NOFOLLOW`,
mode 0600, under a name with a random part (a new one on `EEXIST`), and published with
`renameat2(RENAME_NOREPLACE)` ([`Temp::publish`]): a name that exists is replaced only where
[`Replace`] says so, and never by writing through it.

Which symlinks a walk follows is the one rule to know ([`Dir::create_all`]): in a path the user
named (an output directory in the configuration or on the command line), a symlink owned by root or
by this process's effective uid is followed (resolved here, one component at a time); one owned by
anyone else is refused. Below a directory a request names ([`Place::join`]: `kinetrace trigger
--out`, a dynolog request), no symlink is followed at all, and every directory must be owned by
root or the effective uid and be writable by nobody else unless sticky.

Files: `dir.rs` (the walk, [`Dir`] and [`Place`]), `file.rs` (temporary files and publishing).
*/
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod dir;
mod file;

pub use dir::{Dir, Place};
pub use file::{open_append, write_new, Replace, Temp};

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}
