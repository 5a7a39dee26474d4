//! What only PostgreSQL has (being written).
