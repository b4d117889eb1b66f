//! A progress bar on a terminal while an analysis reads a trace: drawn on
//! stderr only when stderr is a terminal and the work has taken longer
//! than a second, and cleared when it ends; nothing otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long work goes before the bar appears (`TRAPLINE_PROGRESS_AFTER_MS`
/// overrides it, for the tests).
const AFTER: Duration = Duration::from_secs(1);

/// A bar is up (work inside work, as `report`'s analyses, shares it).
static SHOWN: AtomicBool = AtomicBool::new(false);

/// Runs `work`, showing its progress as `what` if it takes a while.
pub fn while_running<T>(what: &str, work: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() || SHOWN.swap(true, Ordering::Relaxed) {
        return work();
    }
    let after = std::env::var("TRAPLINE_PROGRESS_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(AFTER, Duration::from_millis);
    let (done, finished) = mpsc::channel::<()>();
    let what = what.to_string();
    let display = std::thread::spawn(move || {
        // With no delay the bar is drawn at least once, however soon the
        // work ends (the test of the bar relies on it).
        if !after.is_zero() && finished.recv_timeout(after).is_ok() {
            return;
        }
        // Set up hidden, then shown: the first frame is a whole one.
        let bar = ProgressBar::hidden();
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} chunks, {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        let mut shown = false;
        loop {
            let (pass, read, chunks) = trapline_analysis::progress::now();
            bar.set_message(format!("trapline {what}: pass {}", pass.max(1)));
            bar.set_length(chunks);
            bar.set_position(read);
            if !shown {
                bar.set_draw_target(ProgressDrawTarget::stderr());
                bar.tick();
                shown = true;
            }
            if finished.recv_timeout(Duration::from_millis(100)).is_ok() {
                break;
            }
        }
        bar.finish_and_clear();
    });
    let out = work();
    let _ = done.send(());
    let _ = display.join();
    SHOWN.store(false, Ordering::Relaxed);
    out
}
