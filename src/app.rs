//! The composition root: builds runtime objects from a validated spec.
