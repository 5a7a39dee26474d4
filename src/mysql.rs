//! What only MySQL has (being written).
