//! One document's revision tree on one copy, as CouchDB keeps it: revisions `pos-hash`, each
//! with its parent; bodies kept at the leaves only (what compaction leaves); a path per leaf
//! stemmed to `_revs_limit` revisions. Interactive writes extend a leaf; replication merges a
//! leaf's path, grafting it where a revision is shared and planting it as a new root where none
//! is (a copy that fell more than `_revs_limit` writes behind comes back as a conflict of its
//! own, docs/CLUSTER.md).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A revision id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rev {
    pub pos: u64,
    pub hash: String,
}

impl Rev {
    pub fn parse(s: &str) -> Option<Rev> {
        let (pos, hash) = s.split_once('-')?;
        Some(Rev {
            pos: pos.parse().ok()?,
            hash: hash.to_owned(),
        })
    }

    /// The id CouchDB gives the child of `parent` with this body: the same body on the same
    /// parent always makes the same revision.
    pub fn child(parent: Option<&Rev>, deleted: bool, body: &Value) -> Rev {
        let mut h = Sha256::new();
        h.update(if deleted { b"d|" } else { b"l|" });
        if let Some(p) = parent {
            h.update(p.to_string().as_bytes());
        }
        h.update(b"|");
        h.update(serde_json::to_vec(body).expect("json").as_slice());
        let digest = h.finalize();
        let hash: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        Rev {
            pos: parent.map_or(1, |p| p.pos + 1),
            hash,
        }
    }
}

impl fmt::Display for Rev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.pos, self.hash)
    }
}

#[derive(Debug, Clone)]
struct Node {
    parent: Option<Rev>,
    deleted: bool,
    /// Kept while the revision is a leaf.
    body: Option<Arc<Value>>,
}

/// A leaf's revision with what replication sends of it.
#[derive(Debug, Clone)]
pub struct LeafPath {
    /// From the leaf down to the oldest revision this copy keeps of its branch.
    pub revs: Vec<(Rev, bool)>,
    pub body: Arc<Value>,
}

/// The revision tree of one document on one copy.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    nodes: BTreeMap<Rev, Node>,
}

/// Why an interactive write was refused on a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict;

impl Tree {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn parents(&self) -> BTreeSet<&Rev> {
        self.nodes
            .values()
            .filter_map(|n| n.parent.as_ref())
            .collect()
    }

    pub fn leaves(&self) -> Vec<Rev> {
        let parents = self.parents();
        self.nodes
            .keys()
            .filter(|r| !parents.contains(r))
            .cloned()
            .collect()
    }

    pub fn is_leaf(&self, rev: &Rev) -> bool {
        self.nodes.contains_key(rev) && !self.nodes.values().any(|n| n.parent.as_ref() == Some(rev))
    }

    pub fn contains(&self, rev: &Rev) -> bool {
        self.nodes.contains_key(rev)
    }

    pub fn is_deleted(&self, rev: &Rev) -> bool {
        self.nodes.get(rev).is_some_and(|n| n.deleted)
    }

    /// CouchDB's winner: a live leaf before a deleted one, then the longest path, then the
    /// greater revision id.
    pub fn winner(&self) -> Option<Rev> {
        self.leaves().into_iter().max_by(|a, b| {
            let key = |r: &Rev| (!self.is_deleted(r), r.pos, r.hash.clone());
            key(a).cmp(&key(b))
        })
    }

    /// The live leaves other than the winner.
    pub fn conflicts(&self) -> Vec<Rev> {
        let winner = self.winner();
        let mut c: Vec<Rev> = self
            .leaves()
            .into_iter()
            .filter(|r| Some(r) != winner.as_ref() && !self.is_deleted(r))
            .collect();
        c.sort_by(|a, b| (b.pos, &b.hash).cmp(&(a.pos, &a.hash)));
        c
    }

    /// A leaf's body.
    pub fn body(&self, rev: &Rev) -> Option<Arc<Value>> {
        self.nodes.get(rev).and_then(|n| n.body.clone())
    }

    /// The winner exists and is not deleted.
    pub fn live(&self) -> bool {
        self.winner().is_some_and(|w| !self.is_deleted(&w))
    }

    /// An interactive write (`new_edits=true`): a child of `parent`, which must be a leaf here;
    /// without `parent`, a new document (or the child of a deleted winner). What CouchDB's copy
    /// answers: the new revision, or a conflict.
    pub fn update(
        &mut self,
        parent: Option<&Rev>,
        deleted: bool,
        body: Value,
        revs_limit: usize,
    ) -> Result<Rev, Conflict> {
        let parent = match parent {
            Some(p) => {
                if !self.is_leaf(p) {
                    return Err(Conflict);
                }
                Some(p.clone())
            }
            None => match self.winner() {
                None => None,
                Some(w) if self.is_deleted(&w) => Some(w),
                Some(_) => return Err(Conflict),
            },
        };
        let rev = Rev::child(parent.as_ref(), deleted, &body);
        if self.nodes.contains_key(&rev) {
            return Err(Conflict);
        }
        if let Some(p) = &parent {
            if let Some(n) = self.nodes.get_mut(p) {
                n.body = None;
            }
        }
        self.nodes.insert(
            rev.clone(),
            Node {
                parent,
                deleted,
                body: Some(Arc::new(body)),
            },
        );
        self.stem(revs_limit);
        Ok(rev)
    }

    /// `rev` and its ancestors as this copy keeps them, newest first (`revs=true`'s
    /// `_revisions`).
    pub fn history(&self, rev: &Rev) -> Vec<Rev> {
        let mut out = Vec::new();
        let mut at = Some(rev.clone());
        while let Some(r) = at {
            let Some(node) = self.nodes.get(&r) else {
                break;
            };
            out.push(r);
            at = node.parent.clone();
        }
        out
    }

    /// What replication sends of every leaf: its path (as this copy keeps it) and its body.
    pub fn leaf_paths(&self) -> Vec<LeafPath> {
        self.leaves()
            .into_iter()
            .filter_map(|leaf| {
                let body = self.body(&leaf)?;
                let mut revs = Vec::new();
                let mut at = Some(leaf);
                while let Some(r) = at {
                    let node = &self.nodes[&r];
                    revs.push((r.clone(), node.deleted));
                    at = node.parent.clone();
                }
                Some(LeafPath { revs, body })
            })
            .collect()
    }

    /// Merges a leaf's path from another copy (`new_edits=false`): grafted below the newest
    /// revision of it this copy holds, or planted as a new root when it holds none. `true` when
    /// something changed.
    pub fn merge(&mut self, path: &LeafPath, revs_limit: usize) -> bool {
        let shared = path
            .revs
            .iter()
            .position(|(r, _)| self.nodes.contains_key(r));
        if shared == Some(0) {
            // The leaf itself is here; it may have been stemmed to a bodiless interior node
            // elsewhere, never here if it is still a leaf.
            if self.is_leaf(&path.revs[0].0) {
                if let Some(n) = self.nodes.get_mut(&path.revs[0].0) {
                    if n.body.is_none() {
                        n.body = Some(path.body.clone());
                    }
                }
            }
            return false;
        }
        let new = shared.unwrap_or(path.revs.len());
        for i in (0..new).rev() {
            let (rev, deleted) = &path.revs[i];
            let parent = path.revs.get(i + 1).map(|(r, _)| r.clone());
            let parent = parent.filter(|p| i + 1 < new || self.nodes.contains_key(p));
            if let Some(p) = &parent {
                if let Some(n) = self.nodes.get_mut(p) {
                    n.body = None;
                }
            }
            self.nodes.insert(
                rev.clone(),
                Node {
                    parent,
                    deleted: *deleted,
                    body: (i == 0).then(|| path.body.clone()),
                },
            );
        }
        self.stem(revs_limit);
        true
    }

    /// Keeps, of every leaf's branch, its last `limit` revisions; a revision whose parent goes
    /// becomes a root.
    pub fn stem(&mut self, limit: usize) {
        let limit = limit.max(1);
        let mut keep: BTreeSet<Rev> = BTreeSet::new();
        for leaf in self.leaves() {
            let mut at = Some(leaf);
            let mut n = 0;
            while let Some(r) = at {
                if n == limit {
                    break;
                }
                at = self.nodes[&r].parent.clone();
                keep.insert(r);
                n += 1;
            }
        }
        if keep.len() == self.nodes.len() {
            return;
        }
        self.nodes.retain(|r, _| keep.contains(r));
        let present: BTreeSet<Rev> = self.nodes.keys().cloned().collect();
        for node in self.nodes.values_mut() {
            if node.parent.as_ref().is_some_and(|p| !present.contains(p)) {
                node.parent = None;
            }
        }
    }

    /// The same leaves: copies that agree (how far back each keeps a branch may differ, as
    /// it does between CouchDB's copies once stemmed).
    pub fn same_as(&self, other: &Tree) -> bool {
        self.leaves() == other.leaves()
    }
}

/// The model's own checks, run before any seed.
pub mod checks {
    use super::*;
    use serde_json::json;

    pub fn the_same_body_on_the_same_parent_is_the_same_revision() {
        let a = Rev::child(None, false, &json!({"x": 1}));
        assert_eq!(a, Rev::child(None, false, &json!({"x": 1})));
        assert_ne!(a, Rev::child(None, false, &json!({"x": 2})));
        assert_eq!(Rev::child(Some(&a), false, &json!({"x": 1})).pos, 2);
    }

    pub fn a_copy_takes_one_child_of_a_leaf() {
        let mut t = Tree::default();
        let r1 = t.update(None, false, json!({"v": 1}), 20).unwrap();
        let r2 = t.update(Some(&r1), false, json!({"v": 2}), 20).unwrap();
        assert_eq!(
            t.update(Some(&r1), false, json!({"v": 3}), 20),
            Err(Conflict)
        );
        assert_eq!(t.update(None, false, json!({"v": 3}), 20), Err(Conflict));
        assert_eq!(t.winner(), Some(r2));
        assert!(t.conflicts().is_empty());
    }

    pub fn a_copy_that_fell_behind_past_the_limit_comes_back_as_a_conflict() {
        let mut ahead = Tree::default();
        let mut behind = Tree::default();
        let mut r = ahead.update(None, false, json!({"v": 0}), 5).unwrap();
        for p in ahead.leaf_paths() {
            behind.merge(&p, 5);
        }
        for v in 1..12 {
            r = ahead.update(Some(&r), false, json!({"v": v}), 5).unwrap();
        }
        for p in ahead.leaf_paths() {
            assert!(behind.merge(&p, 5));
        }
        for p in behind.leaf_paths() {
            ahead.merge(&p, 5);
        }
        assert_eq!(ahead.winner(), Some(r.clone()));
        assert_eq!(ahead.conflicts().len(), 1, "{:?}", ahead.leaves());
        assert!(ahead.same_as(&behind));
        // Within the limit, the same catch-up moves the copy forward.
        let mut ahead = Tree::default();
        let mut behind = Tree::default();
        let mut r = ahead.update(None, false, json!({"v": 0}), 20).unwrap();
        for p in ahead.leaf_paths() {
            behind.merge(&p, 20);
        }
        for v in 1..12 {
            r = ahead.update(Some(&r), false, json!({"v": v}), 20).unwrap();
        }
        for p in ahead.leaf_paths() {
            behind.merge(&p, 20);
        }
        assert_eq!(behind.leaves(), vec![r]);
    }

    pub fn the_winner_is_live_then_longest_then_greatest() {
        let mut t = Tree::default();
        let r1 = t.update(None, false, json!({"v": 1}), 20).unwrap();
        let mut other = t.clone();
        let a = t.update(Some(&r1), false, json!({"v": "a"}), 20).unwrap();
        let b = other
            .update(Some(&r1), false, json!({"v": "b"}), 20)
            .unwrap();
        for p in other.leaf_paths() {
            t.merge(&p, 20);
        }
        let w = t.winner().unwrap();
        assert_eq!(w, a.clone().max(b.clone()));
        let loser = if w == a { b } else { a };
        assert_eq!(t.conflicts(), vec![loser.clone()]);
        // Deleting the winner makes the other leaf win.
        let tomb = t.update(Some(&w), true, json!({}), 20).unwrap();
        assert_eq!(t.winner(), Some(loser));
        assert!(t.is_deleted(&tomb));
    }

    pub fn run() {
        the_same_body_on_the_same_parent_is_the_same_revision();
        a_copy_takes_one_child_of_a_leaf();
        a_copy_that_fell_behind_past_the_limit_comes_back_as_a_conflict();
        the_winner_is_live_then_longest_then_greatest();
    }
}
