//! A run's checkpoint files: one file per rank, and the stream's resolved document beside them
//! (docs/checkpoint.md, "A run's files").
//!
//! Everything here is pure over file names and texts: the caller lists a directory and reads a
//! file by name, on a local disk, an object store, an Orbax path or an fsspec file system, so
//! the CLI, the Lightning sidecars and the JAX Orbax handler share one set of rules: how a
//! rank's file is named, which files belong to one save, when they can be resumed by another
//! number of ranks, and which files a new save leaves stale.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::split::{is_shared_name, RankFile, SharedDocument};
use super::{refuse, shared_reference, Checkpoint, Position};
use crate::error::{Error, Result};

/// How a run names its per-rank files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Naming {
    /// `stream-rank{rank}-of-{world_size}.json`: what `o41 checkpoint reshard`, the core's
    /// `write_checkpoint` and the Lightning sidecars write.
    Stream,
    /// `process_{index}-of-{count}.json`: grain's state files, which the JAX Orbax handler
    /// writes (by JAX process index and count) so that grain's restore reads them too.
    Process,
}

impl Naming {
    /// Every naming, in the order names are tried.
    pub const ALL: [Naming; 2] = [Naming::Stream, Naming::Process];

    fn parts(self) -> (&'static str, &'static str) {
        match self {
            Naming::Stream => ("stream-rank", "-of-"),
            Naming::Process => ("process_", "-of-"),
        }
    }

    /// The file of `index` of `count` (a rank of a world, or a process of a job).
    pub fn file_name(self, index: usize, count: usize) -> String {
        let (head, middle) = self.parts();
        format!("{head}{index}{middle}{count}.json")
    }

    /// The naming's pattern, for messages: `stream-rank<r>-of-<n>.json`.
    pub fn pattern(self) -> &'static str {
        match self {
            Naming::Stream => "stream-rank<r>-of-<n>.json",
            Naming::Process => "process_<i>-of-<n>.json",
        }
    }

    /// `(index, count)` when `name` is this naming's file of an index below its count (decimal
    /// digits only; a leading zero is read, as earlier releases read it).
    pub fn parse(self, name: &str) -> Option<(usize, usize)> {
        let (head, middle) = self.parts();
        let (index, count) = name
            .strip_prefix(head)?
            .strip_suffix(".json")?
            .split_once(middle)?;
        let index = decimal(index)?;
        let count = decimal(count)?;
        (index < count).then_some((index, count))
    }

    /// The naming, index and count of any per-rank file's name.
    pub fn of(name: &str) -> Option<(Naming, usize, usize)> {
        Naming::ALL
            .into_iter()
            .find_map(|naming| naming.parse(name).map(|(i, n)| (naming, i, n)))
    }
}

fn decimal(text: &str) -> Option<usize> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| text.parse().ok()).flatten()
}

/// The per-rank files among one directory's entries.
#[derive(Debug, Clone)]
pub struct RunFiles {
    place: String,
    /// By `(index, count)` of their names; one name each.
    files: BTreeMap<(usize, usize), (Naming, String)>,
    /// Every entry's name, for the shared documents the rank files name.
    names: Vec<String>,
}

impl RunFiles {
    /// The per-rank files among `names` (the entries of the directory `place` names in errors);
    /// other names are kept for the resolved documents. Two names for one rank of one world
    /// (`process_0-of-2.json` beside `stream-rank0-of-2.json`) leave it unclear which holds the
    /// rank's position: refused, naming both.
    pub fn among(mut names: Vec<String>, place: &str) -> Result<Self> {
        names.sort();
        let sorted = names;
        let mut files = BTreeMap::new();
        for name in &sorted {
            let Some((naming, index, count)) = Naming::of(name) else {
                continue;
            };
            if let Some((_, first)) = files.insert((index, count), (naming, name.clone())) {
                return Err(refuse(format!(
                    "{place} holds two files for rank {index} of {count}, {first} and {name}; \
                     remove the one that is not the rank's position"
                )));
            }
        }
        Ok(Self {
            place: place.to_owned(),
            files,
            names: sorted,
        })
    }

    /// Every per-rank file's name, by `(index, count)`.
    pub fn names(&self) -> impl Iterator<Item = (usize, usize, &str)> {
        self.files
            .iter()
            .map(|(&(index, count), (_, name))| (index, count, name.as_str()))
    }

    /// The number of ranks (or processes) that wrote the files: refused unless they are all of
    /// one world and every rank's file is there. `written_by`: the world an index beside the
    /// files says wrote them (a file it lists and the directory lacks is then named).
    pub fn world_size(&self, written_by: Option<usize>) -> Result<usize> {
        let place = &self.place;
        let mut counts: Vec<usize> = self.files.keys().map(|&(_, count)| count).collect();
        counts.extend(written_by);
        counts.sort_unstable();
        counts.dedup();
        match counts[..] {
            [] => Err(refuse(format!(
                "no per-rank checkpoint file ({} or {}) in {place}",
                Naming::Stream.pattern(),
                Naming::Process.pattern()
            ))),
            [count] => {
                let naming = self.files.values().next().map_or(Naming::Stream, |f| f.0);
                let missing: Vec<String> = (0..count)
                    .filter(|&index| !self.files.contains_key(&(index, count)))
                    .take(4)
                    .map(|index| naming.file_name(index, count))
                    .collect();
                if missing.is_empty() {
                    Ok(count)
                } else {
                    Err(refuse(format!(
                        "{place} lacks {}: every rank of the {count} that wrote it needs its \
                         file there",
                        missing.join(", ")
                    )))
                }
            }
            _ => {
                let shown: Vec<String> = counts.iter().map(usize::to_string).collect();
                Err(refuse(format!(
                    "{place} mixes per-rank files of {} ranks; keep one save's files in a \
                     directory",
                    shown.join(", ")
                )))
            }
        }
    }

    /// The names a save of `world_size` ranks of stream `fingerprint` into this directory
    /// leaves stale: per-rank files of another world, and resolved documents of another
    /// stream (`None`: the save wrote none, so every one is stale). A name saved again by
    /// another world (`last.ckpt`) must not keep the old ranks' files.
    pub fn stale(&self, world_size: Option<usize>, fingerprint: Option<&str>) -> Vec<String> {
        let shared = fingerprint.map(super::shared_name);
        let mut stale: Vec<String> = self
            .files
            .iter()
            .filter(|(&(_, count), _)| Some(count) != world_size)
            .map(|(_, (_, name))| name.clone())
            .collect();
        stale.extend(
            self.names
                .iter()
                .filter(|name| is_shared_name(name) && Some(name.as_str()) != shared.as_deref())
                .cloned(),
        );
        stale
    }

    /// The checkpoint rank `rank` of `world_size` resumes from.
    ///
    /// On the world that wrote the files, the file holding that rank (the one of `own`, this
    /// process's index and count, tried first: a JAX process's file is named by its process
    /// index, which need not be its rank). On another world, every old rank's file is read and
    /// the position moved with [`check_same_place`] then [`Checkpoint::for_world`]. `read`
    /// returns a file's text by name; each resolved document is read and parsed once.
    pub fn restore(
        &self,
        rank: usize,
        world_size: usize,
        own: Option<(usize, usize)>,
        written_by: Option<usize>,
        read: &mut dyn FnMut(&str) -> Result<String>,
    ) -> Result<Checkpoint> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::config(
                "rank",
                format!("rank {rank} is not below world_size {world_size}"),
            ));
        }
        let old = self.world_size(written_by)?;
        let mut reader = Reader::new(self, read);
        if old == world_size {
            // A rank file holds the rank its name says; a process file may hold any rank of
            // its world, so those are all tried, this process's own first.
            let mut order: Vec<(usize, usize)> = own
                .filter(|key| self.files.contains_key(key))
                .into_iter()
                .collect();
            order.push((rank, old));
            if self.files[&(rank, old)].0 == Naming::Process {
                order.extend(self.files.keys().copied());
            }
            let mut tried = Vec::with_capacity(order.len());
            for key in order {
                if tried.contains(&key) {
                    continue;
                }
                tried.push(key);
                let checkpoint = reader.checkpoint(key)?;
                if (checkpoint.rank(), checkpoint.world_size()) == (rank, world_size) {
                    return Ok(checkpoint);
                }
            }
        }
        let stops = self.read_all(&mut reader)?;
        let named: Vec<(&str, Option<&Position>)> = stops
            .iter()
            .map(|(name, checkpoint)| (name.as_str(), Some(&checkpoint.position)))
            .collect();
        check_same_place(&named, world_size)?;
        stops[0].1.for_world(rank, world_size)
    }
}

impl RunFiles {
    /// Every rank's checkpoint of one whole save (refused as [`RunFiles::world_size`] refuses),
    /// by rank; each resolved document is read and parsed once.
    pub fn checkpoints(
        &self,
        written_by: Option<usize>,
        read: &mut dyn FnMut(&str) -> Result<String>,
    ) -> Result<Vec<Checkpoint>> {
        self.world_size(written_by)?;
        let mut all: Vec<Checkpoint> = self
            .read_all(&mut Reader::new(self, read))?
            .into_iter()
            .map(|(_, checkpoint)| checkpoint)
            .collect();
        all.sort_by_key(Checkpoint::rank);
        Ok(all)
    }

    /// Every file's checkpoint with the file's name, in name order.
    fn read_all(&self, reader: &mut Reader<'_>) -> Result<Vec<(String, Checkpoint)>> {
        let keys: Vec<(usize, usize)> = self.files.keys().copied().collect();
        keys.into_iter()
            .map(|key| Ok((self.files[&key].1.clone(), reader.checkpoint(key)?)))
            .collect()
    }
}

/// Reads rank files of one directory, parsing each resolved document once.
struct Reader<'a> {
    files: &'a RunFiles,
    read: &'a mut dyn FnMut(&str) -> Result<String>,
    shared: BTreeMap<String, SharedDocument>,
}

impl<'a> Reader<'a> {
    fn new(files: &'a RunFiles, read: &'a mut dyn FnMut(&str) -> Result<String>) -> Self {
        Self {
            files,
            read,
            shared: BTreeMap::new(),
        }
    }

    /// The checkpoint in the file of `key`, in either form; errors name the file.
    fn checkpoint(&mut self, key: (usize, usize)) -> Result<Checkpoint> {
        let files: &'a RunFiles = self.files;
        let (naming, name) = &files.files[&key];
        let located = |error: Error| {
            refuse(format!(
                "{}: {}",
                join(&files.place, name),
                strip_refusal(&error.to_string())
            ))
        };
        let text = (self.read)(name)?;
        let checkpoint = self.parse(&text).map_err(located)?;
        let (index, count) = key;
        let holds = (checkpoint.rank(), checkpoint.world_size());
        // A process file is named by JAX's process index, which may differ from the rank.
        let expected = match naming {
            Naming::Stream => holds == (index, count),
            Naming::Process => holds.1 == count,
        };
        if !expected {
            return Err(located(refuse(format!(
                "it holds rank {} of {}, not the one its name says",
                holds.0, holds.1
            ))));
        }
        Ok(checkpoint)
    }

    fn parse(&mut self, text: &str) -> Result<Checkpoint> {
        let Some(shared_name) = shared_reference(text)? else {
            return Checkpoint::from_json(text);
        };
        let rank = RankFile::parse(text)?;
        if !self.shared.contains_key(&shared_name) {
            if !self.files.names.contains(&shared_name) {
                return Err(refuse(format!(
                    "it names its resolved document {shared_name}, which is not beside it"
                )));
            }
            let shared_text = (self.read)(&shared_name)?;
            let document = SharedDocument::parse(&shared_name, &shared_text)?;
            self.shared.insert(shared_name.clone(), document);
        }
        rank.with_shared(&self.shared[&shared_name])
    }
}

fn join(place: &str, name: &str) -> String {
    if place.is_empty() {
        return name.to_owned();
    }
    format!("{}/{name}", place.trim_end_matches('/'))
}

fn strip_refusal(message: &str) -> &str {
    message
        .strip_prefix("checkpoint refused: ")
        .unwrap_or(message)
}

/// Refuses to move `stops` onto `world_size` ranks unless they are all at one place.
///
/// `stops` are the old ranks' positions, each named as errors should name it (a file, `rank
/// 3`); `None` is a rank that has not started. Positions are global, so a move is exact only
/// when every old rank belongs to the same stream (fingerprint), stopped in the same
/// curriculum segment and before the same global batch, with the same pending switches;
/// otherwise some batches would be delivered twice or never.
pub fn check_same_place(stops: &[(&str, Option<&Position>)], world_size: usize) -> Result<()> {
    check_same_stream(stops)?;
    let (first_name, first) = stops[0];
    let refused = format!(
        "moving it onto {world_size} ranks is exact only when every old rank stopped at the \
         same place"
    );
    for &(name, stop) in &stops[1..] {
        match (first, stop) {
            (Some(_), None) | (None, Some(_)) => {
                let late = if stop.is_none() { name } else { first_name };
                return Err(refuse(format!("{refused}, but {late} has not started")));
            }
            (Some(a), Some(b)) if !same_place(a, b) => {
                return Err(refuse(format!(
                    "{refused}, and they did not: {first_name} at {}, {name} at {}",
                    place_of(a),
                    place_of(b)
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Refuses `stops` (named positions; `None`: not started) of several streams: files of another
/// run, or of the same run with other shards, fields or seed, are not one stream's ranks.
pub fn check_same_stream(stops: &[(&str, Option<&Position>)]) -> Result<()> {
    if stops.is_empty() {
        return Err(refuse("no checkpoint to move"));
    }
    let mut started = stops
        .iter()
        .filter_map(|&(name, stop)| stop.map(|s| (name, s)));
    let Some((first_name, first)) = started.next() else {
        return Ok(());
    };
    for (name, stop) in started {
        if stop.fingerprint != first.fingerprint {
            return Err(refuse(format!(
                "{first_name} and {name} belong to different streams ({}, {})",
                first.fingerprint, stop.fingerprint
            )));
        }
    }
    Ok(())
}

fn same_place(a: &Position, b: &Position) -> bool {
    (a.cursor.next_batch, a.cursor.segment, &a.switches)
        == (b.cursor.next_batch, b.cursor.segment, &b.switches)
}

fn place_of(position: &Position) -> String {
    let mut out = format!(
        "global batch {} (stage {}",
        position.cursor.next_batch, position.cursor.segment.stage
    );
    for switch in &position.switches {
        let _ = write!(
            out,
            ", switching to stage {} at {}",
            switch.stage, switch.at
        );
    }
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    #[test]
    fn names_round_trip_and_only_decimal_ones_parse() {
        for naming in Naming::ALL {
            assert_eq!(naming.parse(&naming.file_name(3, 8)), Some((3, 8)));
            assert_eq!(Naming::of(&naming.file_name(0, 1)), Some((naming, 0, 1)));
        }
        assert_eq!(
            Naming::Stream.parse("stream-rank01-of-2.json"),
            Some((1, 2))
        );
        for name in [
            "stream-rank2-of-2.json",
            "stream-rank-1-of-2.json",
            "stream-rank0-of-2.json.tmp",
            "process_+0-of-2.json",
            "process_ 0-of-2.json",
            "stream-rank0-of-99999999999999999999999.json",
            "resolved-fnv1a64-00.json",
        ] {
            assert_eq!(Naming::of(name), None, "{name}");
        }
    }

    #[test]
    fn a_directory_with_two_names_for_one_rank_is_refused() {
        let error = RunFiles::among(
            strings(&["stream-rank0-of-2.json", "process_0-of-2.json"]),
            "ckpt",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("ckpt holds two files for rank 0 of 2"),
            "{error}"
        );
    }

    #[test]
    fn a_save_is_whole_and_of_one_world() {
        let world = |names: &[&str]| {
            RunFiles::among(strings(names), "d")
                .unwrap()
                .world_size(None)
        };
        assert_eq!(
            world(&["process_0-of-2.json", "process_1-of-2.json"]).unwrap(),
            2
        );
        let missing = world(&["process_0-of-3.json"]).unwrap_err().to_string();
        assert!(
            missing.contains("d lacks process_1-of-3.json, process_2-of-3.json"),
            "{missing}"
        );
        let mixed = world(&["stream-rank0-of-1.json", "stream-rank0-of-2.json"]);
        assert!(mixed
            .unwrap_err()
            .to_string()
            .contains("mixes per-rank files of 1, 2 ranks"));
        let none = world(&["notes.txt"]).unwrap_err().to_string();
        assert!(none.contains("no per-rank checkpoint file"), "{none}");
        let indexed = RunFiles::among(strings(&["stream-rank1-of-2.json"]), "d").unwrap();
        let listed = indexed.world_size(Some(2)).unwrap_err().to_string();
        assert!(
            listed.contains("d lacks stream-rank0-of-2.json"),
            "{listed}"
        );
        let other = indexed.world_size(Some(3)).unwrap_err().to_string();
        assert!(
            other.contains("mixes per-rank files of 2, 3 ranks"),
            "{other}"
        );
    }

    #[test]
    fn a_save_of_another_world_leaves_the_old_files_stale() {
        let files = RunFiles::among(
            strings(&[
                "stream-rank0-of-2.json",
                "stream-rank1-of-2.json",
                "stream-rank0-of-1.json",
                "resolved-fnv1a64-0000000000000001.json",
                "resolved-fnv1a64-0000000000000002.json",
                "datamodule.json",
            ]),
            "d",
        )
        .unwrap();
        assert_eq!(
            files.stale(Some(1), Some("fnv1a64:0000000000000002")),
            [
                "stream-rank0-of-2.json",
                "stream-rank1-of-2.json",
                "resolved-fnv1a64-0000000000000001.json"
            ]
        );
        assert_eq!(
            files.stale(None, None).len(),
            5,
            "a save of no rank keeps none"
        );
    }
}
