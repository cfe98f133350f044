//! [`Items`]: each staged op's buffers, in push order, kept by a
//! [`Batch`](super::Batch) and then by its launch (or its capture) until
//! each op's work takes its own.
//!
//! A batch may hold ops of any buffer types, so the buffers are kept
//! type-erased. While every op has the same type (the usual group: a
//! bucket of same-dtype gradients) they share one typed vector, so staging
//! an op allocates nothing and taking it back frees nothing; the first op
//! of another type moves them into a box each.

use std::any::Any;
use std::fmt;

/// Each op's buffers, by index (see the module docs).
pub(super) struct Items(Repr);

enum Repr {
    /// Nothing pushed yet: room for this many when the first comes.
    Empty(usize),
    /// Every op of one type.
    Same(Box<dyn Slots>),
    /// Ops of several types, a box each.
    Mixed(Vec<Option<Box<dyn Any + Send>>>),
}

/// One buffer type's vector, its entries taken one by one.
trait Slots: Send {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn len(&self) -> usize;
    fn any_left(&self) -> bool;
    fn into_boxes(self: Box<Self>) -> Vec<Option<Box<dyn Any + Send>>>;
}

impl<C: Send + 'static> Slots for Vec<Option<C>> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn any_left(&self) -> bool {
        self.iter().any(Option::is_some)
    }

    fn into_boxes(self: Box<Self>) -> Vec<Option<Box<dyn Any + Send>>> {
        self.into_iter()
            .map(|c| c.map(|c| Box::new(c) as Box<dyn Any + Send>))
            .collect()
    }
}

impl fmt::Debug for Items {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Items").field("len", &self.len()).finish()
    }
}

impl Default for Items {
    fn default() -> Self {
        Items::with_capacity(0)
    }
}

impl Items {
    /// No buffers yet; room for `n` ops of one type once the first comes.
    pub(super) fn with_capacity(n: usize) -> Self {
        Items(Repr::Empty(n))
    }

    /// Number of ops pushed (taken ones included).
    pub(super) fn len(&self) -> usize {
        match &self.0 {
            Repr::Empty(_) => 0,
            Repr::Same(s) => s.len(),
            Repr::Mixed(v) => v.len(),
        }
    }

    /// True while some op's buffers are still here.
    pub(super) fn any_left(&self) -> bool {
        match &self.0 {
            Repr::Empty(_) => false,
            Repr::Same(s) => s.any_left(),
            Repr::Mixed(v) => v.iter().any(Option::is_some),
        }
    }

    /// Keeps `bufs` as the next op's; returns its index.
    pub(super) fn push<C: Send + 'static>(&mut self, bufs: C) -> usize {
        let index = self.len();
        if let Some(v) = self.same_mut::<C>() {
            v.push(Some(bufs));
            return index;
        }
        self.0 = match std::mem::replace(&mut self.0, Repr::Empty(0)) {
            Repr::Empty(n) => {
                let mut v: Vec<Option<C>> = Vec::with_capacity(n.max(1));
                v.push(Some(bufs));
                Repr::Same(Box::new(v))
            }
            // Another type than the ops' so far: each op gets a box.
            Repr::Same(s) => {
                let mut boxes = s.into_boxes();
                boxes.push(Some(Box::new(bufs)));
                Repr::Mixed(boxes)
            }
            Repr::Mixed(mut v) => {
                v.push(Some(Box::new(bufs)));
                Repr::Mixed(v)
            }
        };
        index
    }

    /// The buffers of op `index`, if they are of type `C` and still here.
    pub(super) fn get<C: 'static>(&self, index: usize) -> Option<&C> {
        match &self.0 {
            Repr::Empty(_) => None,
            Repr::Same(s) => s
                .as_any()
                .downcast_ref::<Vec<Option<C>>>()?
                .get(index)?
                .as_ref(),
            Repr::Mixed(v) => v.get(index)?.as_ref()?.downcast_ref::<C>(),
        }
    }

    /// [`get`](Self::get), mutable.
    pub(super) fn get_mut<C: 'static>(&mut self, index: usize) -> Option<&mut C> {
        match &mut self.0 {
            Repr::Empty(_) => None,
            Repr::Same(s) => typed::<C>(s)?.get_mut(index)?.as_mut(),
            Repr::Mixed(v) => v.get_mut(index)?.as_mut()?.downcast_mut::<C>(),
        }
    }

    /// Takes the buffers of op `index` if they are of type `C` and still
    /// here (once: a second take finds nothing). Buffers of another type
    /// stay.
    pub(super) fn take<C: 'static>(&mut self, index: usize) -> Option<C> {
        match &mut self.0 {
            Repr::Mixed(v) => {
                let slot = v.get_mut(index)?;
                if !slot.as_ref()?.is::<C>() {
                    return None;
                }
                slot.take()?.downcast::<C>().ok().map(|b| *b)
            }
            Repr::Same(s) => typed::<C>(s)?.get_mut(index)?.take(),
            Repr::Empty(_) => None,
        }
    }

    /// The typed vector, if every op so far has buffers of type `C`.
    fn same_mut<C: 'static>(&mut self) -> Option<&mut Vec<Option<C>>> {
        match &mut self.0 {
            Repr::Same(s) => typed::<C>(s),
            _ => None,
        }
    }
}

/// `s` as the vector of type `C` it may be.
fn typed<C: 'static>(s: &mut Box<dyn Slots>) -> Option<&mut Vec<Option<C>>> {
    s.as_any_mut().downcast_mut::<Vec<Option<C>>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_type_is_kept_unboxed_and_taken_once() {
        let mut items = Items::with_capacity(4);
        assert!(!items.any_left());
        assert_eq!(items.push(1u32), 0);
        assert_eq!(items.push(2u32), 1);
        assert!(matches!(items.0, Repr::Same(_)));
        assert_eq!(items.get::<u32>(1), Some(&2));
        assert_eq!(items.get::<u64>(1), None, "another type is not found");
        *items.get_mut::<u32>(0).unwrap() = 7;
        assert_eq!(items.take::<u32>(0), Some(7));
        assert_eq!(items.take::<u32>(0), None, "taken once");
        assert!(items.any_left());
        assert_eq!(items.take::<u32>(1), Some(2));
        assert!(!items.any_left());
        assert_eq!(items.len(), 2);
    }

    #[test]
    fn a_second_type_boxes_every_op_and_keeps_their_places() {
        let mut items = Items::default();
        items.push(String::from("a"));
        items.push(String::from("b"));
        assert_eq!(items.take::<String>(0).as_deref(), Some("a"));
        assert_eq!(items.push(3i8), 2);
        assert!(matches!(items.0, Repr::Mixed(_)));
        assert_eq!(items.get::<String>(0), None, "taken before the move");
        assert_eq!(items.get::<String>(1).map(String::as_str), Some("b"));
        assert_eq!(items.take::<i8>(1), None, "a take of the wrong type");
        assert_eq!(items.get::<String>(1).map(String::as_str), Some("b"));
        assert_eq!(items.take::<i8>(2), Some(3));
        assert_eq!(items.take::<String>(1).as_deref(), Some("b"));
        assert!(!items.any_left());
        assert_eq!(items.len(), 3);
        assert_eq!(items.push(String::from("c")), 3, "boxed from now on");
        assert_eq!(items.take::<String>(3).as_deref(), Some("c"));
    }

    #[test]
    fn buffers_left_are_dropped_with_the_items() {
        let kept = std::sync::Arc::new(());
        let mut items = Items::default();
        items.push(kept.clone());
        items.push(kept.clone());
        assert_eq!(std::sync::Arc::strong_count(&kept), 3);
        drop(items.take::<std::sync::Arc<()>>(0));
        drop(items);
        assert_eq!(std::sync::Arc::strong_count(&kept), 1);
    }
}
