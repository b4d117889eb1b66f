//! The guest's console: the marker lines `/init` prints around the
//! command (its libraries' load addresses, its process id, its exit
//! status) and the command's own output between them.

use std::path::PathBuf;

#[derive(Default, Debug)]
pub struct Ran {
    /// Each loaded object's path and where the loader mapped it.
    pub libraries: Vec<(PathBuf, u64)>,
    pub pid: Option<u32>,
    pub exit_status: Option<i32>,
    pub output: String,
    /// What `/init` could not do.
    pub failed: Option<String>,
    /// The kernel's panic line.
    pub panic: Option<String>,
}

#[derive(PartialEq)]
enum Part {
    Before,
    Libraries,
    Run,
    After,
}

pub fn parse(text: &str, marker: &str) -> Ran {
    let mut ran = Ran::default();
    let mut part = Part::Before;
    for raw_line in text.split('\n') {
        let line = raw_line.trim_end_matches('\r');
        if line.contains("Kernel panic") && ran.panic.is_none() {
            ran.panic = Some(line.trim().to_string());
        }
        let Some(rest) = line.strip_prefix(marker).and_then(|r| r.strip_prefix('-')) else {
            match part {
                Part::Libraries => {
                    if let Some(lib) = library(line) {
                        ran.libraries.push(lib);
                    }
                }
                Part::Run if ran.pid.is_some() => {
                    ran.output.push_str(line);
                    ran.output.push('\n');
                }
                _ => {}
            }
            continue;
        };
        let (word, value) = rest.split_once(' ').unwrap_or((rest, ""));
        match word {
            "LIBRARIES" => part = Part::Libraries,
            "RUN" => part = Part::Run,
            "PID" => ran.pid = value.trim().parse().ok(),
            "EXIT" => {
                ran.exit_status = value.trim().parse().ok();
                part = Part::After;
            }
            "FAILED" => ran.failed = Some(value.trim().to_string()),
            _ => {}
        }
    }
    if ran.output.ends_with('\n') && !text.is_empty() {
        // The line break before the EXIT marker is the console's.
        let trimmed = ran.output.trim_end_matches('\n').len();
        ran.output.truncate(trimmed);
        if trimmed > 0 {
            ran.output.push('\n');
        }
    }
    ran
}

/// `\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007ffff7dc5000)`.
fn library(line: &str) -> Option<(PathBuf, u64)> {
    let path = crate::guest::loaded_path(line)?;
    let address = line.rsplit_once("(0x")?.1.trim_end_matches(')');
    Some((path, u64::from_str_radix(address, 16).ok()?))
}

/// Where two console texts first differ.
pub fn first_difference(recorded: &str, replayed: &str) -> String {
    let a: Vec<&str> = recorded.split('\n').collect();
    let b: Vec<&str> = replayed.split('\n').collect();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i), b.get(i));
        if x != y {
            return format!(
                "console line {} was {:?} when recorded, {:?} in the replay",
                i + 1,
                x.map_or("(none)", |s| s.trim_end_matches('\r')),
                y.map_or("(none)", |s| s.trim_end_matches('\r'))
            );
        }
    }
    "the consoles differ".into()
}
