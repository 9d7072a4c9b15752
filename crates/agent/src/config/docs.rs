//! `docs/config.md`'s key table, generated from [`KEYS`].

use super::{KEYS, KINETO_IGNORED, KINETO_UNSUPPORTED, NOT_PROFILER_KEYS};

/// The key table as the Markdown that `docs/config.md` holds between its markers.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| Environment | Kineto file key | Accepted form | Default | Meaning |\n|---|---|---|---|---|\n",
    );
    let cell = |s: &str| {
        s.replace('|', "\\|")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    for k in KEYS {
        let code = |s: Option<&str>| s.map(|s| format!("`{s}`")).unwrap_or_else(|| "–".into());
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            code(k.env),
            code(k.kineto),
            cell(k.form),
            cell(k.default),
            cell(k.doc)
        ));
    }
    out.push_str("\nKineto file keys accepted and ignored:\n\n");
    for (k, why) in KINETO_IGNORED {
        out.push_str(&format!("- `{k}`: {why}.\n"));
    }
    out.push_str("\nKineto file keys that are an error (kinetrace does not implement them): ");
    let list: Vec<String> = KINETO_UNSUPPORTED
        .iter()
        .map(|k| format!("`{k}`"))
        .collect();
    out.push_str(&list.join(", "));
    out.push_str(".\n\n`KINETRACE_*` variables read by other kinetrace tools and tests, ignored by the profiler: ");
    let list: Vec<String> = NOT_PROFILER_KEYS.iter().map(|k| format!("`{k}`")).collect();
    out.push_str(&list.join(", "));
    out.push_str(".\n");
    out
}
