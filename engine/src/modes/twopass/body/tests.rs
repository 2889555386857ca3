//! Two-pass frame bodies. (Writing and loading piles is tested with the store, in
//! `piles/store.rs`.)

use super::*;

/// Regression (issue 13): pile frames stored record lengths as u32, so a record of
/// 4 GiB or more was framed with its length cut and the pile pass failed with "pile
/// ends inside a frame". A unit with such a record gets a wide body (u64 lengths), and the
/// store's frame length is a u64 too.
#[test]
fn bodies_carry_lengths_of_4_gib_and_more() {
    let big = u32::MAX as u64 + 2;
    let mut head = Vec::new();
    let len = Body::encode(&mut head, 9, [3, big].into_iter());
    assert_eq!(head.len(), BODY_HEAD + 2 * 8);
    assert_eq!(len, (BODY_HEAD + 16) as u64 + 3 + big);
    let b = Body::parse(&head).unwrap();
    assert_eq!(
        b,
        Body {
            unit: 9,
            n: 2,
            wide: true
        }
    );
    let lens = &head[BODY_HEAD..];
    assert_eq!((b.len(lens, 0), b.len(lens, 1)), (3, big as usize));
    // The store frames such a body with a wide head.
    assert_eq!(frame::head_len(len), frame::HEAD + 8);
    // Small records keep u32 lengths.
    let mut narrow = Vec::new();
    Body::encode(&mut narrow, 2, [5, 6].into_iter());
    assert_eq!(narrow.len(), BODY_HEAD + 2 * 4);
    assert!(!Body::parse(&narrow).unwrap().wide);
    // A body too short for the lengths it announces is refused, not read past.
    assert!(Body::parse(&narrow[..narrow.len() - 1]).is_none());
    assert!(Body::parse(&narrow[..5]).is_none());
}
