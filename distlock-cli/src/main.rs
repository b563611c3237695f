//! `distlock`: run a program under a distributed lock or as leader, from
//! shells, cron and CI, over Redis or ZooKeeper.
//!
//! ```text
//! distlock --url redis://redis.internal:6379 exec -n jobs/nightly -- ./nightly.sh
//! distlock --url zk://zk1.internal:2181/ci elect scheduler -- ./scheduler
//! ```
//!
//! See `distlock --help` and the README's section "The `distlock` command"
//! for every subcommand and the exit codes.

mod child;
mod cli;
mod commands;
mod failure;
mod guardian;
mod report;
mod spinner;

use std::io::Write as _;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser as _;

use crate::cli::Cli;
use crate::failure::{say, Failure, SOFTWARE, USAGE};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == guardian::ARG) {
        let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        return ExitCode::from(guardian::run(&rest));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(&e)),
    };
    init_tracing(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("cannot start the runtime: {e}");
            return ExitCode::from(SOFTWARE);
        }
    };
    let code = match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(Failure { code, message }) => {
            if !message.is_empty() {
                say!("{message}");
            }
            code
        }
    };
    let _ = std::io::stdout().flush();
    // Whatever the backend left in the background (a release on drop) has
    // had its chance: close() ran before this.
    drop(runtime);
    ExitCode::from(code)
}

/// Prints clap's verdict: help and version in full (exit 0), an error as
/// one line (exit 64).
fn usage_error(e: &clap::Error) -> u8 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            USAGE
        }
        _ => {
            say!("{}", one_line(e));
            USAGE
        }
    }
}

/// Clap's message on one line, with the hint that matters most.
fn one_line(e: &clap::Error) -> String {
    let args: Vec<String> = std::env::args().collect();
    let runs = args.iter().any(|a| a == "exec" || a == "elect");
    let observe = args.iter().any(|a| a == "--observe");
    let dashes = args.iter().any(|a| a == "--");
    let rendered = e.render().to_string();
    // The first paragraph: the message and what it lists (missing arguments).
    let first = rendered
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let first = first.trim_start_matches("error: ").trim_end_matches(':');
    if runs && !observe && !dashes {
        return format!(
            "{first}: missing `--` before the command (distlock exec NAME -- CMD [ARGS...])"
        );
    }
    format!("{first} (see --help)")
}

fn init_tracing(verbose: u8) {
    let level = match verbose {
        0 => return,
        1 => tracing::Level::INFO,
        2 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    // Colour only for a person at a terminal: never into a pipe or a log
    // file, and never with NO_COLOR set (https://no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(colour)
        .init();
}
