//! Pile frames and pile loading, on real files.

use super::*;

/// Loading a pile in key sub-ranges returns each frame exactly once overall.
#[test]
fn key_sub_ranges_partition_a_pile() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let path = dir.path().join("pile");
    let mut bytes = Vec::new();
    let keys: Vec<u64> = (0..500u64).map(|u| EpochKey::new(1, 2).key(u)).collect();
    for (u, &k) in keys.iter().enumerate() {
        bytes.extend_from_slice(&k.to_le_bytes());
        bytes.extend_from_slice(&(u as u64).to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(b"abc");
    }
    std::fs::write(&path, &bytes).unwrap();
    let mut seen = Vec::new();
    for pass in 0..7u128 {
        let (a, b) = ((1u128 << 64) * pass / 7, (1u128 << 64) * (pass + 1) / 7);
        let mut buf = LargeBuf::default();
        load_pile(&path, a, b, &mut buf, &Stop::default()).unwrap();
        let data = buf.as_slice();
        let mut at = 0;
        while at < data.len() {
            let k = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
            assert!((a..b).contains(&(k as u128)));
            seen.push(k);
            at += 20 + 4 + 3;
        }
    }
    seen.sort_unstable();
    let mut want = keys.clone();
    want.sort_unstable();
    assert_eq!(seen, want);
}

/// Regression (issue 13): pile frames stored record lengths as u32, so a record of
/// 4 GiB or more was framed with its length cut and the pile pass failed with "pile
/// ends inside a frame". A unit with such a record gets a wide frame (u64 lengths).
#[test]
fn frames_carry_lengths_of_4_gib_and_more() {
    let big = u32::MAX as u64 + 2;
    let mut head = Vec::new();
    FrameHead::encode(&mut head, 7, 9, [3, big].into_iter());
    assert_eq!(head.len(), HEAD + 2 * 8);
    let h = FrameHead::parse(&head);
    assert_eq!(
        h,
        FrameHead {
            key: 7,
            unit: 9,
            n: 2,
            wide: true
        }
    );
    let lens = &head[HEAD..];
    assert_eq!((h.len(lens, 0), h.len(lens, 1)), (3, big as usize));
    assert_eq!(h.body(lens), Some(big as usize + 3));
    // Without its 4 GiB of bytes the frame is incomplete, not misread.
    assert!(frame_at(&head, 0).is_none());
    // Small records keep u32 lengths.
    let mut narrow = Vec::new();
    FrameHead::encode(&mut narrow, 1, 2, [5, 6].into_iter());
    assert_eq!(narrow.len(), HEAD + 2 * 4);
    assert!(!FrameHead::parse(&narrow).wide);
    // Lengths that add up past the address space are a damaged frame, not a panic.
    let mut bad = Vec::new();
    FrameHead::encode(&mut bad, 1, 2, [u64::MAX, u64::MAX].into_iter());
    assert!(FrameHead::parse(&bad).body(&bad[HEAD..]).is_none());
    assert!(frame_at(&bad, 0).is_none());
}

/// Narrow and wide frames side by side: every reader of piles parses both the same.
#[test]
fn wide_and_narrow_frames_read_back_alike() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let path = dir.path().join("pile");
    let mut bytes = Vec::new();
    let mut want = Vec::new();
    for u in 0..300u64 {
        let k = EpochKey::new(3, 4).key(u);
        let recs: Vec<Vec<u8>> = (0..u % 4)
            .map(|r| vec![r as u8 + 1; (u + r) as usize % 7])
            .collect();
        let at = bytes.len();
        FrameHead::encode(&mut bytes, k, u, recs.iter().map(|r| r.len() as u64));
        if u % 3 == 0 {
            // Rewrite as a wide frame (the scatter makes one only for a 4 GiB record).
            let h = FrameHead::parse(&bytes[at..]);
            let lens: Vec<u64> = (0..h.n)
                .map(|i| h.len(&bytes[at + HEAD..], i) as u64)
                .collect();
            bytes.truncate(at + 16);
            bytes.extend_from_slice(&(h.n as u32 | WIDE).to_le_bytes());
            for l in lens {
                bytes.extend_from_slice(&l.to_le_bytes());
            }
        }
        for r in &recs {
            bytes.extend_from_slice(r);
        }
        want.push((k, u, recs));
    }
    let mut frames = Vec::new();
    assert_eq!(index_frames(&bytes, 0, &mut frames), bytes.len());
    assert_eq!(frames.len(), 300);
    let read_back = |data: &[u8], at: usize| {
        let f = frame_at(data, at).unwrap();
        let h = f.head;
        let lens = &data[at + HEAD..at + HEAD + h.lens_bytes()];
        let mut off = at + HEAD + lens.len();
        let recs: Vec<Vec<u8>> = (0..h.n)
            .map(|i| {
                let r = data[off..off + h.len(lens, i)].to_vec();
                off += r.len();
                r
            })
            .collect();
        assert_eq!(off, f.end);
        (h.key, h.unit, recs)
    };
    let got: Vec<_> = frames
        .iter()
        .map(|&(_, at)| read_back(&bytes, at))
        .collect();
    assert_eq!(got, want);
    // Loaded in key sub-ranges, every frame comes back whole exactly once.
    std::fs::write(&path, &bytes).unwrap();
    let mut seen = Vec::new();
    for pass in 0..3u128 {
        let (a, b) = ((1u128 << 64) * pass / 3, (1u128 << 64) * (pass + 1) / 3);
        let mut buf = LargeBuf::default();
        load_pile(&path, a, b, &mut buf, &Stop::default()).unwrap();
        let mut fr = Vec::new();
        frame_index(buf.as_slice(), &mut fr);
        seen.extend(fr.iter().map(|&(_, at)| read_back(buf.as_slice(), at)));
    }
    seen.sort_by_key(|f| f.1);
    assert_eq!(seen, want);
    // A pile cut inside a frame is refused by the loader, naming where.
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let mut buf = LargeBuf::default();
    let e = load_pile(&path, 0, 1 << 64, &mut buf, &Stop::default())
        .unwrap_err()
        .to_string();
    // The offset named is where the cut frame starts.
    let last = frames.last().unwrap().1;
    assert!(
        e.contains("pile ends inside a frame") && e.contains(&format!("at byte {last}")),
        "{e}"
    );
}
