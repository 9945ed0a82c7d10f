//! (cases are added here)
