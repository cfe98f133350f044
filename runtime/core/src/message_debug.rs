//! `Debug` for error types that shows their message.
//!
//! A `main` that returns an error with `?` prints it as `Error: {:?}`, and
//! `unwrap`/`expect` print the `Debug` form too. A derived `Debug` would
//! show bare structure there (`Rendezvous(Env(NoLauncher))`) where the
//! error's `Display` says what went wrong and what to do. So chorus's
//! error types write their message for `{:?}`, and their structure, field
//! by field as a derived `Debug` would, for the alternate form `{:#?}`
//! (what `dbg!` uses). Nested errors follow the same rule: in the
//! alternate form every level shows its structure.
//!
//! [`fmt()`] is the one place that decides between the two;
//! [`debug_shows_message!`](crate::debug_shows_message) implements `Debug`
//! with it for an enum, from a list of its variants and their fields
//! (checked by the compiler: a variant or field left out does not build).
//! Types it does not fit (generic structs) call [`fmt()`] themselves. This
//! crate's own files use the macro by its name (it is declared before
//! them in `lib.rs`); other crates as `chorus_core::debug_shows_message!`.

use std::fmt;
use std::marker::PhantomData;

/// Writes `value`'s message (its `Display`) for `{:?}`, and its structure,
/// written by `structure`, for the alternate form `{:#?}`.
///
/// # Errors
///
/// The formatter's.
pub fn fmt<T: fmt::Display + ?Sized>(
    value: &T,
    f: &mut fmt::Formatter<'_>,
    structure: impl FnOnce(&mut fmt::Formatter<'_>) -> fmt::Result,
) -> fmt::Result {
    if f.alternate() {
        structure(f)
    } else {
        fmt::Display::fmt(value, f)
    }
}

/// Shows a type by its name: buffers inside an error are shown by their
/// type (their contents are the user's data, or unspecified after a
/// failure, and may be large), whether or not the type is `Debug`.
pub struct TypeName<B: ?Sized>(PhantomData<B>);

impl<B: ?Sized> TypeName<B> {
    /// The name of `B`.
    pub fn of() -> Self {
        TypeName(PhantomData)
    }
}

impl<B: ?Sized> fmt::Debug for TypeName<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::any::type_name::<B>())
    }
}

/// Implements `Debug` for the error enum `$ty` as [`fmt()`] says: its
/// message for `{:?}`, its structure for `{:#?}`.
///
/// List every variant with the names of its fields: `Name { a, b }` for
/// a struct variant, `Name(x)` for a tuple variant (the names only bind
/// the fields), `Name` for a unit variant. The list is matched
/// exhaustively, so a variant or a field missing from it is a compile
/// error.
///
/// # Examples
///
/// ```
/// #[derive(thiserror::Error)]
/// enum E {
///     #[error("key {key} is missing; set it first")]
///     Missing { key: String },
///     #[error("the store failed: {0}")]
///     Store(String),
///     #[error("no launcher")]
///     NoLauncher,
/// }
/// chorus_core::debug_shows_message!(E { Missing { key }, Store(cause), NoLauncher });
///
/// let e = E::Missing { key: "a".into() };
/// assert_eq!(format!("{e:?}"), "key a is missing; set it first");
/// assert_eq!(format!("{:?}", E::NoLauncher), "no launcher");
/// assert_eq!(
///     format!("{:#?}", E::Store("gone".into())),
///     "Store(\n    \"gone\",\n)"
/// );
/// ```
#[macro_export]
macro_rules! debug_shows_message {
    ($ty:ident {
        $($v:ident $({ $($named:ident),* $(,)? })? $(( $($positional:ident),* $(,)? ))?),*
        $(,)?
    }) => {
        impl ::core::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                $crate::message_debug::fmt(self, f, |f| match self {
                    $($ty::$v $({ $($named),* })? $(( $($positional),* ))? => {
                        #[allow(unused_mut)]
                        let mut s = $crate::message_debug::Structure::new(stringify!($v));
                        $($(s.field(Some(stringify!($named)), $named);)*)?
                        $($(s.field(None, $positional);)*)?
                        s.finish(f)
                    })*
                })
            }
        }
    };
}

/// The structure of one value of an enum, as a derived `Debug` writes
/// it: `Name { a: .., b: .. }`, `Name(..)` or `Name`. What
/// [`debug_shows_message!`](crate::debug_shows_message) writes for `{:#?}`.
#[doc(hidden)]
#[derive(Debug)]
pub struct Structure<'a> {
    name: &'static str,
    fields: Vec<(Option<&'static str>, &'a dyn fmt::Debug)>,
}

impl<'a> Structure<'a> {
    /// A variant named `name`, without fields so far.
    pub fn new(name: &'static str) -> Self {
        Structure {
            name,
            fields: Vec::new(),
        }
    }

    /// Adds a field: named (a struct variant's) or not (a tuple
    /// variant's).
    pub fn field(&mut self, name: Option<&'static str>, value: &'a dyn fmt::Debug) {
        self.fields.push((name, value));
    }

    /// Writes it.
    ///
    /// # Errors
    ///
    /// The formatter's.
    pub fn finish(self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fields.first() {
            None => f.write_str(self.name),
            Some((Some(_), _)) => {
                let mut d = f.debug_struct(self.name);
                for (name, value) in &self.fields {
                    d.field(name.unwrap_or_default(), value);
                }
                d.finish()
            }
            Some((None, _)) => {
                let mut d = f.debug_tuple(self.name);
                for (_, value) in &self.fields {
                    d.field(value);
                }
                d.finish()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A local error with every kind of variant, as the crates' errors
    /// have them.
    #[derive(thiserror::Error)]
    enum Sample {
        #[error("rank {rank} timed out after {after:?}; check rank {rank}")]
        Timeout {
            rank: usize,
            after: std::time::Duration,
        },
        #[error("rendezvous: {0}")]
        Env(Inner),
        #[error("nothing to do")]
        Unit,
    }

    #[derive(thiserror::Error)]
    enum Inner {
        #[error("no rank in the environment; start it with a launcher")]
        NoLauncher,
    }

    debug_shows_message!(Sample {
        Timeout { rank, after },
        Env(inner),
        Unit,
    });
    debug_shows_message!(Inner { NoLauncher });

    #[test]
    fn debug_is_the_message_and_the_alternate_form_the_structure() {
        let e = Sample::Env(Inner::NoLauncher);
        // What `?` in main prints: the message, nested messages included.
        assert_eq!(
            format!("{e:?}"),
            "rendezvous: no rank in the environment; start it with a launcher"
        );
        assert_eq!(format!("{e:?}"), e.to_string());
        // The structure, with the nested error's structure too.
        assert_eq!(format!("{e:#?}"), "Env(\n    NoLauncher,\n)");

        let t = Sample::Timeout {
            rank: 3,
            after: std::time::Duration::from_secs(2),
        };
        assert_eq!(format!("{t:?}"), "rank 3 timed out after 2s; check rank 3");
        assert_eq!(
            format!("{t:#?}"),
            "Timeout {\n    rank: 3,\n    after: 2s,\n}"
        );
        assert_eq!(format!("{:?}", Sample::Unit), "nothing to do");
        assert_eq!(format!("{:#?}", Sample::Unit), "Unit");
    }

    #[test]
    fn a_result_unwrapped_or_returned_from_main_shows_the_message() {
        let r: Result<(), Sample> = Err(Sample::Unit);
        let shown = format!("{r:?}");
        assert_eq!(shown, "Err(nothing to do)");
    }

    #[test]
    fn type_names_stand_for_buffers() {
        let n = super::TypeName::<Vec<f32>>::of();
        assert_eq!(format!("{n:?}"), "alloc::vec::Vec<f32>");
    }
}
