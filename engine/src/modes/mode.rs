//! The read modes by name: what a user asks for (`--mode`, the daemon's `--mode`), parsed
//! once where the user speaks and passed on typed. A mode's name is only spelled here.

use super::Baseline;

/// How a read is served: one of the two readers of the order contract, the planner's
/// choice between them, or a baseline order for comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The planner picks [`Mode::Lirs`] or [`Mode::TwoPass`] (see [`crate::plan`]).
    Auto,
    /// Random reads straight from the device, in the epoch's order.
    Lirs,
    /// A sequential scatter into scratch piles, each ordered in memory: the same batches.
    TwoPass,
    /// The dataset read once into memory, every later epoch permuted there: the same
    /// batches (see [`super::resident`]).
    Resident,
    /// Baseline: a shuffle buffer over a sequential read ([`Baseline::Buffer`]).
    Buffer,
    /// Baseline: blocks of records, only the block order shuffled ([`Baseline::Bmf`]).
    Bmf,
    /// Baseline: file order, no shuffle ([`Baseline::Sequential`]).
    Sequential,
}

impl Mode {
    /// Every mode, in the order messages list them.
    pub const ALL: [Mode; 7] = [
        Mode::Auto,
        Mode::Lirs,
        Mode::TwoPass,
        Mode::Resident,
        Mode::Buffer,
        Mode::Bmf,
        Mode::Sequential,
    ];

    /// The modes that deliver the order contract, and `auto`, which picks one of them:
    /// what the daemon serves and what `riffle plan` explains.
    pub const CONTRACT: [Mode; 3] = [Mode::Auto, Mode::Lirs, Mode::TwoPass];

    /// The modes `riffle plan` prices and explains, and `auto` picks among in process: the
    /// contract's, and [`Mode::Resident`] (not served by the daemon yet).
    pub const PLANNED: [Mode; 4] = [Mode::Auto, Mode::Lirs, Mode::TwoPass, Mode::Resident];

    /// The name users give and reports print: `auto`, `lirs`, `two-pass`, `resident`,
    /// `buffer`, `bmf`, `sequential`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Lirs => "lirs",
            Mode::TwoPass => "two-pass",
            Mode::Resident => "resident",
            Mode::Buffer => "buffer",
            Mode::Bmf => "bmf",
            Mode::Sequential => "sequential",
        }
    }

    /// The mode named `s`, if it is one of `among`; otherwise the message users see:
    /// `unknown mode 'x': expected auto, lirs or two-pass`.
    pub fn parse_among(s: &str, among: &[Mode]) -> Result<Mode, String> {
        if let Some(&m) = among.iter().find(|m| m.name() == s) {
            return Ok(m);
        }
        let names: Vec<&str> = among.iter().map(|m| m.name()).collect();
        let expected = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => "no mode".into(),
        };
        Err(format!("unknown mode '{s}': expected {expected}"))
    }

    /// Whether it reads a baseline's order rather than the contract's.
    pub fn is_baseline(self) -> bool {
        matches!(self, Mode::Buffer | Mode::Bmf | Mode::Sequential)
    }

    /// The baseline it reads, with a shuffle buffer of `buffer` records or blocks of
    /// `block` records (each at least one); `None` for the contract's modes.
    pub fn baseline(self, buffer: u64, block: u64) -> Option<Baseline> {
        match self {
            Mode::Buffer => Some(Baseline::Buffer {
                size: buffer.max(1),
            }),
            Mode::Bmf => Some(Baseline::Bmf {
                block: block.max(1),
            }),
            Mode::Sequential => Some(Baseline::Sequential),
            Mode::Auto | Mode::Lirs | Mode::TwoPass | Mode::Resident => None,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    /// Any of [`Mode::ALL`] by its name.
    fn from_str(s: &str) -> Result<Mode, String> {
        Mode::parse_among(s, &Mode::ALL)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Baseline {
    /// The mode that reads it.
    pub fn mode(&self) -> Mode {
        match self {
            Baseline::Sequential => Mode::Sequential,
            Baseline::Bmf { .. } => Mode::Bmf,
            Baseline::Buffer { .. } => Mode::Buffer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_parses_back_from_its_name() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
            assert_eq!(m.to_string(), m.name());
        }
    }

    #[test]
    fn unknown_modes_are_refused_with_the_modes_offered() {
        assert_eq!(
            "magic".parse::<Mode>(),
            Err(
                "unknown mode 'magic': expected auto, lirs, two-pass, resident, buffer, bmf \
                 or sequential"
                    .into()
            )
        );
        assert_eq!(
            Mode::parse_among("bmf", &Mode::CONTRACT),
            Err("unknown mode 'bmf': expected auto, lirs or two-pass".into())
        );
        assert_eq!(
            Mode::parse_among("two-pass", &Mode::CONTRACT),
            Ok(Mode::TwoPass)
        );
    }

    #[test]
    fn baselines_carry_their_sizes_and_name_their_mode() {
        assert_eq!(Mode::Lirs.baseline(1, 1), None);
        assert_eq!(
            Mode::Bmf.baseline(10, 0),
            Some(Baseline::Bmf { block: 1 }),
            "a block is at least one record"
        );
        for m in Mode::ALL {
            let b = m.baseline(100, 64);
            assert_eq!(b.is_some(), m.is_baseline());
            if let Some(b) = b {
                assert_eq!((b.mode(), b.name()), (m, m.name()));
            }
        }
    }
}
