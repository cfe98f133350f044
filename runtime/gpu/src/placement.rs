//! Which side of the machine a buffer lives on: [`Placement`] maps a
//! buffer type to [`OnHost`] (a `Vec` of an [`Element`] type) or
//! [`OnDevice`] (any [`DeviceMem`], chorus's or another crate's). chorus
//! picks an op's backend from it at compile time.

use chorus_core::Element;

use crate::nccl::DeviceMem;

/// Buffers in host memory: `Vec<T>` of an [`Element`] type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OnHost;

/// Buffers in GPU memory: every [`DeviceMem`] type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OnDevice;

/// Where a buffer type lives. Implemented for `Vec<T>` (`T` an
/// [`Element`]) and for every [`DeviceMem`]; implement `DeviceMem` to
/// give a type of your own a placement.
pub trait Placement {
    /// [`OnHost`] or [`OnDevice`].
    type Place;
}

impl<T: Element> Placement for Vec<T> {
    type Place = OnHost;
}

impl<B: DeviceMem> Placement for B {
    type Place = OnDevice;
}
