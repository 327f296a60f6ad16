//! Reading PostgreSQL's node trees and lists from Rust.

use pgrx::pg_sys;

/// Whether `node` is a node of type `tag`.
///
/// # Safety
/// `node` is NULL or a node.
pub unsafe fn is_a(node: *mut pg_sys::Node, tag: pg_sys::NodeTag) -> bool {
    !node.is_null() && (*node).type_ == tag
}

/// A list's length (0 for NIL).
///
/// # Safety
/// `list` is NIL or a pointer list.
pub unsafe fn list_len(list: *mut pg_sys::List) -> i32 {
    if list.is_null() {
        0
    } else {
        (*list).length
    }
}

/// The elements of a pointer list of `T` nodes.
///
/// # Safety
/// `list` is NIL or a pointer list of `T`.
pub unsafe fn list_of<T>(list: *mut pg_sys::List) -> Vec<*mut T> {
    if list.is_null() {
        return Vec::new();
    }
    let cells = std::slice::from_raw_parts((*list).elements, (*list).length as usize);
    cells.iter().map(|cell| cell.ptr_value as *mut T).collect()
}
