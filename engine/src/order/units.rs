//! Shuffling units: a record each (`record` grouping), or the records that start in one
//! aligned block of a file (`page` grouping, the LIRS paper's page-aware shuffling,
//! improved): one read per unit covers every record starting in it, including one that
//! crosses into the next block, so no block is read twice for nothing. A record longer
//! than a block is a unit of its own. Units never span files.

use std::ops::Range;

use super::IdVec;

/// How records are grouped into shuffling units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grouping {
    /// Every record is placed independently: an exact uniform shuffle.
    Record,
    /// Records starting in the same aligned block of `unit` bytes move together.
    Page {
        /// The block size.
        unit: u64,
    },
}

impl Grouping {
    /// `record` or `page`.
    pub fn name(&self) -> &'static str {
        match self {
            Grouping::Record => "record",
            Grouping::Page { .. } => "page",
        }
    }
}

/// What grouping needs to know of a dataset's records (`Dataset::layout` makes it): how
/// many there are, how they fall into files (ids run through the files in turn) and where
/// each lies in its file. The order contract sees nothing else of a dataset.
pub struct RecordLayout<'a> {
    /// Records in the sequence the order shuffles.
    pub records: u64,
    /// Records in each file, in id order.
    pub file_records: Vec<u64>,
    /// Where record `i` of file `f` lies in it: (byte offset, length).
    pub span: Box<dyn Fn(usize, u64) -> (u64, u64) + 'a>,
}

/// The units of a dataset: contiguous ranges of record ids.
#[derive(Clone, Debug)]
pub struct Units {
    records: u64,
    /// For page grouping: the first record of each unit, then the record count.
    starts: Option<IdVec>,
}

impl Units {
    /// Groups the records of `layout`.
    pub fn new(layout: &RecordLayout<'_>, grouping: Grouping) -> Units {
        let records = layout.records;
        let Grouping::Page { unit } = grouping else {
            return Units {
                records,
                starts: None,
            };
        };
        let unit = unit.max(1);
        let mut starts = IdVec::with_capacity(records, 0);
        let mut id = 0u64;
        for (f, &n) in layout.file_records.iter().enumerate() {
            let mut block = u64::MAX;
            for i in 0..n {
                let (offset, len) = (layout.span)(f, i);
                let b = offset / unit;
                if len > unit || b != block || i == 0 {
                    starts.push(id);
                    // A record longer than a block ends its unit at once.
                    block = if len > unit { u64::MAX } else { b };
                }
                id += 1;
            }
        }
        starts.push(records);
        if let IdVec::U32(v) = &mut starts {
            v.shrink_to_fit();
        } else if let IdVec::U64(v) = &mut starts {
            v.shrink_to_fit();
        }
        Units {
            records,
            starts: Some(starts),
        }
    }

    /// Units of `block` consecutive records (the block-minimization baseline: blocks cut
    /// once, only their order shuffled), or one unit of everything (`block >= records`).
    pub fn blocks(records: u64, block: u64) -> Units {
        let block = block.max(1);
        let mut starts = IdVec::with_capacity(records, 0);
        let mut id = 0;
        while id < records {
            starts.push(id);
            id += block;
        }
        starts.push(records);
        Units {
            records,
            starts: Some(starts),
        }
    }

    /// Number of units.
    pub fn len(&self) -> u64 {
        match &self.starts {
            None => self.records,
            Some(s) => s.len() as u64 - 1,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The record ids of unit `u`.
    #[inline]
    pub fn records(&self, u: u64) -> Range<u64> {
        match &self.starts {
            None => u..u + 1,
            Some(s) => s.get(u as usize)..s.get(u as usize + 1),
        }
    }

    /// Bytes of memory held.
    pub fn bytes(&self) -> u64 {
        self.starts.as_ref().map(IdVec::bytes).unwrap_or(0)
    }

    /// Mean records per unit.
    pub fn mean_records(&self) -> f64 {
        self.records as f64 / self.len().max(1) as f64
    }
}
