//! Reading the plugin's raw log (its format: `crates/vm-plugin/src/lib.rs`).

use crate::VmError;

pub const MAGIC: &[u8; 8] = b"TLVMRAW1";

#[derive(Clone, Debug, PartialEq)]
pub enum Stack {
    None,
    /// The stack's bytes from the stack pointer up.
    Raw(Vec<u8>),
    /// Return addresses found on a kernel stack, each with the target of
    /// the direct call before it (0: an indirect call).
    Scanned(Vec<(u64, u64)>),
    /// Not a stack: the words of an array a call was passed (a bulk
    /// free's blocks).
    Words(Vec<u64>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Enter {
    pub trap: u32,
    pub call: u64,
    pub icount: u64,
    pub cr3: u64,
    pub fs_base: u64,
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    /// rdi, rsi, rdx, rcx, r8, r9.
    pub args: [u64; 6],
    /// The word the plan asked for at the first argument plus an offset.
    pub peeked: u64,
    pub stack: Stack,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Enter(Enter),
    Return {
        call: u64,
        icount: u64,
        rax: u64,
        /// The word the first argument pointed to, when the plan asked.
        through: u64,
    },
    End {
        icount: u64,
        calls: u64,
        returns: u64,
        abandoned: u64,
    },
    Sample(Sample),
}

/// A CPU sample of the traced process.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub icount: u64,
    pub cr3: u64,
    pub fs_base: u64,
    /// Where the vCPU was: in user code, or in the kernel.
    pub rip: u64,
    /// The user registers (the same in user mode; those the kernel's
    /// entry saved, or 0 when they could not be read).
    pub user_rip: u64,
    pub user_rsp: u64,
    pub user_rbp: u64,
    /// The user stack's bytes from `user_rsp` up.
    pub stack: Vec<u8>,
}

pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Result<Reader<'a>, VmError> {
        if !data.starts_with(MAGIC) {
            return Err(VmError::damaged("the plugin wrote no raw log".into()));
        }
        Ok(Reader {
            data,
            at: MAGIC.len(),
        })
    }

    /// Where the next record starts.
    pub fn offset(&self) -> usize {
        self.at
    }

    fn u64(&mut self) -> Option<u64> {
        let b = self.data.get(self.at..self.at + 8)?;
        self.at += 8;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.data.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }

    fn u8(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn record(&mut self) -> Option<Record> {
        match self.u8()? {
            1 => {
                let trap = self.u32()?;
                let (call, icount, cr3, fs_base) =
                    (self.u64()?, self.u64()?, self.u64()?, self.u64()?);
                let (rip, rsp, rbp) = (self.u64()?, self.u64()?, self.u64()?);
                let mut args = [0u64; 6];
                for a in &mut args {
                    *a = self.u64()?;
                }
                let peeked = self.u64()?;
                let kind = self.u8()?;
                let len = self.u32()? as usize;
                let bytes = self.data.get(self.at..self.at + len)?;
                self.at += len;
                let stack = match kind {
                    1 => Stack::Raw(bytes.to_vec()),
                    2 => Stack::Scanned(
                        bytes
                            .chunks_exact(16)
                            .map(|w| {
                                let word =
                                    |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
                                (word(&w[..8]), word(&w[8..]))
                            })
                            .collect(),
                    ),
                    3 => Stack::Words(
                        bytes
                            .chunks_exact(8)
                            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                            .collect(),
                    ),
                    _ => Stack::None,
                };
                Some(Record::Enter(Enter {
                    trap,
                    call,
                    icount,
                    cr3,
                    fs_base,
                    rip,
                    rsp,
                    rbp,
                    args,
                    peeked,
                    stack,
                }))
            }
            2 => Some(Record::Return {
                call: self.u64()?,
                icount: self.u64()?,
                rax: self.u64()?,
                through: self.u64()?,
            }),
            3 => Some(Record::End {
                icount: self.u64()?,
                calls: self.u64()?,
                returns: self.u64()?,
                abandoned: self.u64()?,
            }),
            4 => {
                let (icount, cr3, fs_base) = (self.u64()?, self.u64()?, self.u64()?);
                let (rip, _rsp, _rbp) = (self.u64()?, self.u64()?, self.u64()?);
                let (user_rip, user_rsp, user_rbp) = (self.u64()?, self.u64()?, self.u64()?);
                let len = self.u32()? as usize;
                let stack = self.data.get(self.at..self.at + len)?.to_vec();
                self.at += len;
                Some(Record::Sample(Sample {
                    icount,
                    cr3,
                    fs_base,
                    rip,
                    user_rip,
                    user_rsp,
                    user_rbp,
                    stack,
                }))
            }
            _ => None,
        }
    }
}

impl Iterator for Reader<'_> {
    type Item = Result<Record, VmError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.data.len() {
            return None;
        }
        let at = self.at;
        match self.record() {
            Some(r) => Some(Ok(r)),
            None => {
                self.at = self.data.len();
                Some(Err(VmError::damaged(format!(
                    "the plugin's raw log is damaged at byte {at}"
                ))))
            }
        }
    }
}

/// The last record's instruction count and kind, for messages.
pub fn last_event(data: &[u8]) -> String {
    let Ok(reader) = Reader::new(data) else {
        return "none".into();
    };
    let mut last = None;
    for r in reader {
        match r {
            Ok(r) => last = Some(r),
            Err(_) => break,
        }
    }
    match last {
        Some(Record::Enter(e)) => {
            format!("trap {} entered at guest instruction {}", e.trap, e.icount)
        }
        Some(Record::Return { call, icount, .. }) => {
            format!("call {call} returned at guest instruction {icount}")
        }
        Some(Record::End { icount, .. }) => format!("the end, at guest instruction {icount}"),
        Some(Record::Sample(s)) => format!("a CPU sample at guest instruction {}", s.icount),
        None => "none".into(),
    }
}

/// An error unless the log ends with its end record.
pub fn check_complete(data: &[u8]) -> Result<(), VmError> {
    let mut ended = false;
    for r in Reader::new(data)? {
        ended = matches!(r?, Record::End { .. });
    }
    if !ended {
        return Err(VmError::damaged(format!(
            "the plugin's raw log has no end (last event: {})",
            last_event(data)
        )));
    }
    Ok(())
}

/// The first record where two raw logs differ.
pub fn first_difference(a: &[u8], b: &[u8]) -> String {
    let (Ok(ra), Ok(rb)) = (Reader::new(a), Reader::new(b)) else {
        return "one log is empty".into();
    };
    for (i, (x, y)) in ra.zip(rb).enumerate() {
        let (x, y) = (x.ok(), y.ok());
        if x != y {
            let at = |r: &Option<Record>| match r {
                Some(Record::Enter(e)) => {
                    format!("trap {} at guest instruction {}", e.trap, e.icount)
                }
                Some(Record::Return { icount, .. }) => {
                    format!("a return at guest instruction {icount}")
                }
                Some(Record::End { icount, .. }) => {
                    format!("the end at guest instruction {icount}")
                }
                Some(Record::Sample(s)) => {
                    format!("a CPU sample at guest instruction {}", s.icount)
                }
                None => "nothing".into(),
            };
            return format!("event {}: {} against {}", i + 1, at(&x), at(&y));
        }
    }
    "one log is longer".into()
}

/// The log without its end record, whose instruction count is where QEMU
/// noticed the guest's power-off: that differs between replays, the events
/// before it do not.
pub fn events_part(data: &[u8]) -> &[u8] {
    let Ok(mut reader) = Reader::new(data) else {
        return data;
    };
    let mut last_start = reader.offset();
    while let Some(r) = reader.next() {
        match r {
            Ok(Record::End { .. }) => return &data[..last_start],
            Ok(_) => last_start = reader.offset(),
            Err(_) => break,
        }
    }
    data
}
