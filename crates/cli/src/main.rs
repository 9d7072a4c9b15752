//! `kinetrace`: the command line. `main` only parses, dispatches and turns errors into an exit
//! code; each subcommand lives in its own module as `run_*`.
#![forbid(unsafe_code)]

mod analyze;
mod cli;
mod convert;
mod csv;
mod diff;
mod diff_csv;
mod doctor;
mod efficiency_view;
mod ending;
mod op_sort;
mod output;
mod record;
mod shim;
mod signals;
mod svg;
mod table;
mod text;
mod trigger;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match cli::Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => match record::missing_dashes_tip(&e, &args) {
            Some(tip) => {
                // clap's message, the tip before its usage line.
                let text = e.render().to_string();
                match text.find("\nUsage:") {
                    Some(i) => eprint!("{}\n{tip}\n{}", &text[..i], &text[i..]),
                    None => eprintln!("{text}{tip}"),
                }
                return ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    let result = match cli.command {
        cli::Command::Analyze(args) => args.plan().and_then(analyze::run_analyze),
        cli::Command::Doctor(args) => args.plan().and_then(doctor::run_doctor),
        cli::Command::Diff(args) => args.plan().and_then(diff::run_diff),
        cli::Command::Record(args) => {
            // First of all: from here no signal can end kinetrace before it reached the command.
            let signals = signals::install();
            args.plan().and_then(|p| record::run_record(p, &signals))
        }
        cli::Command::Trigger(args) => args.plan().and_then(trigger::run_trigger),
        cli::Command::Convert(args) => convert::run_convert(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`kinetrace analyze d | head`) is not a failure.
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("kinetrace: {err:#}");
            ExitCode::from(2)
        }
    }
}
