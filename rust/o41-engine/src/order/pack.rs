//! Token windows: how one shard's token stream becomes fixed-length rows, before the rest of the
//! order function sees them (`docs/order.md`, "Token corpora").
//!
//! Two layouts, both pure functions of the shard's document boundaries, so the rows of a shard
//! are facts about the corpus, the same on every rank count and after every resume:
//!
//! - *packed*: whole documents go first-fit into at most `bins` open windows of `seq_len`
//!   tokens; a document longer than a window is cut into full windows and a tail, and only the
//!   tail is placed first-fit. A window is closed when it is full or when a document fits no
//!   open window and all `bins` are open (the fullest one closes, leaving the least padding).
//! - *stream windows*: windows of `seq_len + 1` tokens starting every `seq_len` tokens, so the
//!   last token of one is the first of the next and every transition is in exactly one window.
//!
//! A plan holds 24 bytes per placed piece of a document and 8 per window.

/// One run of a document's tokens placed in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// First token, as an offset into the shard's token stream.
    pub start: u64,
    /// Position of the run's first token within its document (a tail's is past the full
    /// windows cut from the document before it).
    pub position: u64,
    /// Tokens in the run, at most the window's length.
    pub len: u32,
}

/// Bytes a plan holds per piece and per window, for the memory bound.
pub const PLAN_BYTES_PER_PIECE: u64 = std::mem::size_of::<Piece>() as u64;
const PLAN_BYTES_PER_WINDOW: u64 = 8;

/// The packed windows of one shard: window `w` holds `pieces[starts[w]..starts[w + 1]]`, laid
/// out in order from the window's first token; the rest of the window is padding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackPlan {
    starts: Vec<u64>,
    pieces: Vec<Piece>,
    tokens: u64,
    /// Documents left out (longer than a window, under `overflow="drop"`).
    dropped: u64,
}

impl PackPlan {
    /// Windows in the plan.
    pub fn windows(&self) -> u64 {
        self.starts.len().saturating_sub(1) as u64
    }

    /// The pieces of window `w`, in window order.
    pub fn window(&self, w: u64) -> &[Piece] {
        let w = w as usize;
        &self.pieces[self.starts[w] as usize..self.starts[w + 1] as usize]
    }

    /// The most pieces one window holds.
    pub fn most_pieces(&self) -> u64 {
        self.starts
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }

    /// The largest position within its document of any placed token (0 for none).
    pub fn largest_position(&self) -> u64 {
        self.pieces
            .iter()
            .map(|p| (p.position + u64::from(p.len)).saturating_sub(1))
            .max()
            .unwrap_or(0)
    }

    /// Document tokens placed (padding excluded).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Documents left out rather than split.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Bytes the plan holds.
    pub fn bytes(&self) -> u64 {
        self.pieces.len() as u64 * PLAN_BYTES_PER_PIECE
            + self.starts.len() as u64 * PLAN_BYTES_PER_WINDOW
    }
}

struct Open {
    pieces: Vec<Piece>,
    used: u64,
}

/// Packs documents, given one at a time in corpus order, into windows of `seq_len` tokens with
/// at most `bins` windows open.
pub struct Packer {
    seq_len: u64,
    bins: usize,
    open: Vec<Open>,
    plan: PackPlan,
}

impl Packer {
    /// A packer of windows of `seq_len` tokens (at least 1) with `bins` open windows (at
    /// least 1).
    pub fn new(seq_len: u64, bins: usize) -> Self {
        Packer {
            seq_len: seq_len.max(1),
            bins: bins.max(1),
            open: Vec::new(),
            plan: PackPlan {
                starts: vec![0],
                pieces: Vec::new(),
                tokens: 0,
                dropped: 0,
            },
        }
    }

    /// Bytes the plan holds so far (the open windows' pieces included).
    pub fn bytes(&self) -> u64 {
        let open: u64 = self.open.iter().map(|w| w.pieces.len() as u64).sum();
        self.plan.bytes() + open * PLAN_BYTES_PER_PIECE
    }

    /// Bytes the plan may grow by when the document of `len` tokens is pushed: a window per whole
    /// `seq_len` of it and one piece for the rest. Callers check it against their bound before
    /// [`Packer::push`], which allocates it: a forged length must not be planned first.
    pub fn growth(&self, len: u64) -> u64 {
        (len / self.seq_len + 1).saturating_mul(PLAN_BYTES_PER_PIECE + PLAN_BYTES_PER_WINDOW)
    }

    fn emit(&mut self, pieces: &[Piece]) {
        self.plan.pieces.extend_from_slice(pieces);
        self.plan.starts.push(self.plan.pieces.len() as u64);
    }

    /// Tokens per window.
    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }

    /// Counts a document left out of the plan.
    pub fn leave_out(&mut self) {
        self.plan.dropped += 1;
    }

    /// Places the document of `len` tokens that starts at token `start` of the stream. An
    /// empty document places nothing.
    pub fn push(&mut self, start: u64, len: u64) {
        let n = self.seq_len;
        self.plan.tokens += len;
        let full = len / n;
        for k in 0..full {
            self.emit(&[Piece {
                start: start + k * n,
                position: k * n,
                len: n as u32,
            }]);
        }
        let rest = len - full * n;
        if rest == 0 {
            return;
        }
        let piece = Piece {
            start: start + full * n,
            position: full * n,
            len: rest as u32,
        };
        if let Some(i) = self.open.iter().position(|w| n - w.used >= rest) {
            let window = &mut self.open[i];
            window.pieces.push(piece);
            window.used += rest;
            if window.used == n {
                let window = self.open.remove(i);
                self.emit(&window.pieces);
            }
            return;
        }
        if self.open.len() == self.bins {
            // The fullest window closes (the first of equals): it wastes the least.
            let mut fullest = 0;
            for (i, w) in self.open.iter().enumerate() {
                if w.used > self.open[fullest].used {
                    fullest = i;
                }
            }
            let window = self.open.remove(fullest);
            self.emit(&window.pieces);
        }
        self.open.push(Open {
            pieces: vec![piece],
            used: rest,
        });
    }

    /// Closes the windows still open, in the order they were opened, and returns the plan.
    pub fn finish(mut self) -> PackPlan {
        for window in std::mem::take(&mut self.open) {
            self.emit(&window.pieces);
        }
        self.plan
    }
}

/// Windows of `seq_len + 1` tokens overlapping by one over a stream of `tokens` tokens: every
/// transition once, and a single window for a stream of one token.
pub fn stream_windows(tokens: u64, seq_len: u64) -> u64 {
    match tokens {
        0 => 0,
        1 => 1,
        t => (t - 1).div_ceil(seq_len.max(1)),
    }
}

/// The one piece of stream window `w`.
pub fn stream_window(tokens: u64, seq_len: u64, w: u64) -> Piece {
    let start = w * seq_len;
    Piece {
        start,
        position: start,
        len: (seq_len + 1).min(tokens - start) as u32,
    }
}

/// Stream window `w`'s pieces where the stream's documents are known: `starts` holds each
/// document's first token in stream order (the first is 0; an empty document repeats the next
/// one's start). The window is cut where a document starts inside it, and each piece's
/// position counts from its own document's first token, so a window's `@segment_ids` and
/// `@positions` mark documents as a packed window's do; only the cuts at the window's ends
/// are not documents' ends. Appended to `out`.
pub fn stream_window_pieces(
    tokens: u64,
    seq_len: u64,
    w: u64,
    starts: &[u64],
    out: &mut Vec<Piece>,
) {
    let window = stream_window(tokens, seq_len, w);
    let end = window.start + u64::from(window.len);
    // Starts up to the window's first token: the last of them begins its document.
    let inside = starts.partition_point(|&s| s <= window.start);
    let mut begin = window.start;
    let mut position = window.start - inside.checked_sub(1).map_or(0, |i| starts[i]);
    for &next in starts[inside..].iter().take_while(|&&s| s < end) {
        if next > begin {
            out.push(Piece {
                start: begin,
                position,
                len: (next - begin) as u32,
            });
            begin = next;
            position = 0;
        }
    }
    out.push(Piece {
        start: begin,
        position,
        len: (end - begin) as u32,
    });
}

/// The most pieces [`stream_window_pieces`] gives any window of the stream (0 for none), in
/// time linear in the documents, not the windows: a forged index claiming billions of tokens
/// must not make open visit billions of windows. A window is cut at each distinct document
/// start strictly inside it, and start `x` is strictly inside window `(x - 1) / seq_len` alone
/// (the overlapping token `w * seq_len` starts window `w` and ends window `w - 1`).
pub fn most_stream_pieces(tokens: u64, seq_len: u64, starts: &[u64]) -> u64 {
    let windows = stream_windows(tokens, seq_len);
    if windows == 0 {
        return 0;
    }
    let seq_len = seq_len.max(1);
    let (mut most, mut window, mut cuts, mut last) = (1u64, u64::MAX, 0u64, None);
    for &x in starts.iter().filter(|&&x| 0 < x && x < tokens) {
        if last == Some(x) {
            continue; // an empty document starts where the next one does: one cut
        }
        last = Some(x);
        let w = (x - 1) / seq_len;
        if w >= windows {
            break;
        }
        if w == window {
            cuts += 1;
        } else {
            (window, cuts) = (w, 1);
        }
        most = most.max(cuts + 1);
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan(lengths: &[u64], seq_len: u64, bins: usize) -> PackPlan {
        let mut packer = Packer::new(seq_len, bins);
        let mut start = 0;
        for &len in lengths {
            packer.push(start, len);
            start += len;
        }
        packer.finish()
    }

    #[test]
    fn documents_go_first_fit_into_open_windows() {
        // Windows of 10: [6 | 3 | 4...]: 6 opens w0, 3 joins it, 4 opens w1, 1 fills w0.
        let p = plan(&[6, 3, 4, 1], 10, 2);
        assert_eq!(p.windows(), 2);
        assert_eq!(p.most_pieces(), 3);
        let lens = |w| p.window(w).iter().map(|x| x.len).collect::<Vec<_>>();
        assert_eq!(lens(0), vec![6, 3, 1]);
        assert_eq!(lens(1), vec![4]);
    }

    #[test]
    fn a_long_document_becomes_full_windows_and_a_tail() {
        let p = plan(&[25], 10, 8);
        assert_eq!(p.windows(), 3);
        assert_eq!(
            p.window(2),
            &[Piece {
                start: 20,
                position: 20,
                len: 5
            }]
        );
    }

    #[test]
    fn with_all_bins_open_the_fullest_window_closes() {
        let p = plan(&[7, 8, 5], 10, 2);
        // 7 and 8 open two windows; 5 fits neither, so the 8 closes first.
        assert_eq!(p.window(0)[0].len, 8);
        assert_eq!(p.window(1)[0].len, 7);
        assert_eq!(p.window(2)[0].len, 5);
    }

    fn starts(lengths: &[u64]) -> Vec<u64> {
        lengths
            .iter()
            .scan(0, |at, &len| {
                let start = *at;
                *at += len;
                Some(start)
            })
            .collect()
    }

    #[test]
    fn a_stream_window_is_cut_where_documents_start() {
        // Documents of 3, 0, 4 and 5 tokens; windows of 5 + 1 tokens.
        let starts = starts(&[3, 0, 4, 5]);
        let pieces = |w| {
            let mut out = Vec::new();
            stream_window_pieces(12, 5, w, &starts, &mut out);
            out.iter()
                .map(|p| (p.start, p.position, p.len))
                .collect::<Vec<_>>()
        };
        assert_eq!(pieces(0), vec![(0, 0, 3), (3, 0, 3)]);
        assert_eq!(pieces(1), vec![(5, 2, 2), (7, 0, 4)]);
        assert_eq!(pieces(2), vec![(10, 3, 2)]);
        assert_eq!(most_stream_pieces(12, 5, &starts), 2);
    }

    proptest! {
        /// A stream window's pieces tile it in order, each inside one document, cut exactly at
        /// the documents that start inside it, with positions counted from each document's
        /// start; the most pieces of any window is what the pieces say.
        #[test]
        fn stream_window_pieces_mark_every_document(
            lengths in proptest::collection::vec(0u64..12, 0..40),
            seq_len in 1u64..16,
        ) {
            let starts = starts(&lengths);
            let tokens: u64 = lengths.iter().sum();
            let document_of = |t: u64| starts.partition_point(|&s| s <= t) - 1;
            let mut most = 0;
            for w in 0..stream_windows(tokens, seq_len) {
                let window = stream_window(tokens, seq_len, w);
                let mut pieces = Vec::new();
                stream_window_pieces(tokens, seq_len, w, &starts, &mut pieces);
                most = most.max(pieces.len() as u64);
                let mut at = window.start;
                for (k, piece) in pieces.iter().enumerate() {
                    prop_assert_eq!(piece.start, at);
                    prop_assert!(piece.len > 0);
                    let last = piece.start + u64::from(piece.len) - 1;
                    let doc = document_of(piece.start);
                    prop_assert_eq!(document_of(last), doc, "one document a piece");
                    prop_assert_eq!(piece.position, piece.start - starts[doc]);
                    if k > 0 {
                        prop_assert_eq!(piece.position, 0, "a later piece starts a document");
                    }
                    at = last + 1;
                }
                prop_assert_eq!(at, window.start + u64::from(window.len));
            }
            prop_assert_eq!(most_stream_pieces(tokens, seq_len, &starts), most);
            // The same with the stream's end after the starts, as a token index holds them.
            let mut ended = starts.clone();
            ended.push(tokens);
            prop_assert_eq!(most_stream_pieces(tokens, seq_len, &ended), most);
        }
    }

    #[test]
    fn stream_windows_overlap_by_one_token() {
        assert_eq!(stream_windows(0, 4), 0);
        assert_eq!(stream_windows(1, 4), 1);
        assert_eq!(stream_windows(9, 4), 2);
        assert_eq!(stream_windows(10, 4), 3);
        assert_eq!(stream_window(10, 4, 1).start, 4);
        assert_eq!(stream_window(10, 4, 1).len, 5);
        assert_eq!(stream_window(10, 4, 2).len, 2);
    }

    proptest! {
        #[test]
        fn packing_keeps_documents_whole_and_every_token_once(
            lengths in proptest::collection::vec(0u64..300, 0..60),
            seq_len in 1u64..128,
            bins in 1usize..10,
        ) {
            let p = plan(&lengths, seq_len, bins);
            let mut seen = vec![0u32; lengths.iter().sum::<u64>() as usize];
            let mut pieces_of = vec![Vec::new(); lengths.len()];
            let mut starts = Vec::with_capacity(lengths.len());
            let mut acc = 0;
            for &l in &lengths {
                starts.push(acc);
                acc += l;
            }
            for w in 0..p.windows() {
                let window = p.window(w);
                prop_assert!(!window.is_empty());
                let used: u64 = window.iter().map(|x| u64::from(x.len)).sum();
                prop_assert!(used <= seq_len);
                for piece in window {
                    let d = starts.partition_point(|&s| s <= piece.start) - 1;
                    // Empty documents before d start at the same token; the owner has tokens.
                    let d = (d..lengths.len()).find(|&d| lengths[d] > 0).unwrap();
                    prop_assert_eq!(piece.position, piece.start - starts[d]);
                    prop_assert!(piece.position + u64::from(piece.len) <= lengths[d]);
                    pieces_of[d].push(*piece);
                    for t in piece.start..piece.start + u64::from(piece.len) {
                        seen[t as usize] += 1;
                    }
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
            prop_assert_eq!(p.tokens(), acc);
            for (d, pieces) in pieces_of.iter().enumerate() {
                // Split only to fit: a document of a window or less is one piece, a longer
                // one is full windows and at most one shorter tail.
                let expected = lengths[d].div_ceil(seq_len) as usize;
                prop_assert_eq!(pieces.len(), expected);
                let short = pieces.iter().filter(|x| u64::from(x.len) < seq_len).count();
                prop_assert!(short <= 1);
            }
        }

        #[test]
        fn stream_windows_see_every_transition_once(tokens in 0u64..500, seq_len in 1u64..40) {
            let n = stream_windows(tokens, seq_len);
            let mut seen = vec![0u32; tokens.saturating_sub(1) as usize];
            let mut covered = vec![false; tokens as usize];
            for w in 0..n {
                let piece = stream_window(tokens, seq_len, w);
                prop_assert!(u64::from(piece.len) <= seq_len + 1);
                for t in piece.start..piece.start + u64::from(piece.len) {
                    covered[t as usize] = true;
                }
                for t in piece.start..piece.start + u64::from(piece.len) - 1 {
                    seen[t as usize] += 1;
                }
            }
            prop_assert!(seen.iter().all(|&k| k == 1));
            prop_assert!(covered.iter().all(|&c| c));
        }
    }
}
