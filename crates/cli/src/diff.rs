//! `trapline diff A B`: two runs compared per allocation site.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trapline_analysis::diff;

use crate::args::Format;
use crate::output;

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The baseline trace (A).
    pub a: PathBuf,
    /// The trace compared with it (B).
    pub b: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Runs the command; exit statuses as the other analyses'.
pub fn main(args: DiffArgs) -> ExitCode {
    let (mut a, mut b) = match (
        output::open_trace("diff", &args.a),
        output::open_trace("diff", &args.b),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let report = match crate::progress::while_running("diff", || diff::analyze(&mut a, &mut b)) {
        Ok(r) => r,
        Err(e) => {
            let both = format!("{} or {}", args.a.display(), args.b.display());
            return output::fail("diff", Path::new(&both), e);
        }
    };
    for (side, path) in [(&report.a, &args.a), (&report.b, &args.b)] {
        if side.trace.events == 0 {
            return output::fail("diff", path, "the trace holds no readable events");
        }
    }
    let out = match args.format {
        Format::Text => diff::render_text(&report),
        Format::Json => match output::json(&report) {
            Ok(s) => s,
            Err(e) => return output::fail("diff", &args.b, e),
        },
    };
    output::print(&out);
    ExitCode::SUCCESS
}
