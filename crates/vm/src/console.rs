//! The guest's console: the marker lines `/init` prints around the
//! command (its libraries' load addresses, its process id, its exit
//! status, whether `--timeout` stopped it) and the command's stdout and
//! stderr, each copied after its marker by its length in bytes.

use std::path::PathBuf;

#[derive(Default, Debug)]
pub struct Ran {
    /// Each loaded object's path and where the loader mapped it.
    pub libraries: Vec<(PathBuf, u64)>,
    pub pid: Option<u32>,
    pub exit_status: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The signals `/init` sent at `--timeout` ("TERM", then "KILL").
    pub stopped: Vec<String>,
    /// What `/init` could not do.
    pub failed: Option<String>,
    /// The kernel's panic line.
    pub panic: Option<String>,
}

pub fn parse(text: &[u8], marker: &str) -> Ran {
    let mut ran = Ran::default();
    let mut in_libraries = false;
    let mut pos = 0;
    while pos < text.len() {
        let end = text[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |i| pos + i);
        let raw_line = &text[pos..end];
        pos = (end + 1).min(text.len());
        let line = String::from_utf8_lossy(raw_line);
        let line = line.trim_end_matches('\r');
        if line.contains("Kernel panic") && ran.panic.is_none() {
            ran.panic = Some(line.trim().to_string());
        }
        let Some(rest) = line.strip_prefix(marker).and_then(|r| r.strip_prefix('-')) else {
            if in_libraries {
                if let Some(lib) = library(line) {
                    ran.libraries.push(lib);
                }
            }
            continue;
        };
        in_libraries = false;
        let (word, value) = rest.split_once(' ').unwrap_or((rest, ""));
        match word {
            "LIBRARIES" => in_libraries = true,
            "PID" => ran.pid = value.trim().parse().ok(),
            "EXIT" => ran.exit_status = value.trim().parse().ok(),
            "STOPPED" => ran.stopped.push(value.trim().to_string()),
            "STDOUT" | "STDERR" => {
                // The output's bytes, then the line break `/init` adds.
                let n: usize = value.trim().parse().unwrap_or(0);
                let data = text[pos..(pos + n).min(text.len())].to_vec();
                pos = (pos + n).min(text.len());
                if text.get(pos) == Some(&b'\n') {
                    pos += 1;
                }
                if word == "STDOUT" {
                    ran.stdout = data;
                } else {
                    ran.stderr = data;
                }
            }
            "FAILED" => ran.failed = Some(value.trim().to_string()),
            _ => {}
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
pub fn first_difference(recorded: &[u8], replayed: &[u8]) -> String {
    let recorded = String::from_utf8_lossy(recorded);
    let replayed = String::from_utf8_lossy(replayed);
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

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "TRAPLINE-0badcafe";

    #[test]
    fn output_is_taken_by_its_length_whatever_it_holds() {
        // stdout without a final line break, with a fake marker and a
        // carriage return; stderr with a blank line at its end.
        let stdout = format!("a\r\n{M}-EXIT 0\nno end");
        let text = format!(
            "boot\r\n{M}-LIBRARIES\n\tlibc.so.6 => /lib/libc.so.6 (0x00007ffff7dc5000)\n{M}-RUN\n{M}-PID 42\n{M}-STOPPED TERM\n{M}-EXIT 143\n{M}-STDOUT {}\n{stdout}\n{M}-STDERR 6\noops\n\n\n{M}-DONE\n",
            stdout.len()
        );
        let ran = parse(text.as_bytes(), M);
        assert_eq!(ran.pid, Some(42));
        assert_eq!(ran.exit_status, Some(143));
        assert_eq!(ran.stopped, ["TERM"]);
        assert_eq!(ran.stdout, stdout.as_bytes());
        assert_eq!(ran.stderr, b"oops\n\n");
        assert_eq!(
            ran.libraries,
            [(PathBuf::from("/lib/libc.so.6"), 0x7ffff7dc5000)]
        );
        assert!(ran.failed.is_none() && ran.panic.is_none());
    }

    #[test]
    fn a_console_cut_short_has_no_exit_status() {
        let text = format!("{M}-RUN\n{M}-PID 7\n[ 1.0] Kernel panic - not syncing: x\n");
        let ran = parse(text.as_bytes(), M);
        assert_eq!(ran.pid, Some(7));
        assert_eq!(ran.exit_status, None);
        assert_eq!(
            ran.panic.as_deref(),
            Some("[ 1.0] Kernel panic - not syncing: x")
        );
    }
}
