"""libstdc++'s std::sort and std::partial_sort (GCC 12), in Python: llama.cpp sorts candidates and
vocabulary scores with them, and equal keys end in their order, not a stable one."""
from __future__ import annotations


def _adjust_heap(a, hole: int, n: int, value, key) -> None:
    """std::__adjust_heap then std::__push_heap with comp(x, y) = key(x) > key(y)."""
    top, child = hole, hole
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if key(a[child]) > key(a[child - 1]):
            child -= 1
        a[hole] = a[child]
        hole = child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        a[hole] = a[child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and key(a[parent]) > key(value):
        a[hole] = a[parent]
        hole = parent
        parent = (hole - 1) // 2
    a[hole] = value


def partial_sort(a: list, middle: int, key) -> None:
    """std::partial_sort(a, a + middle, a.end(), [](x, y) { return key(x) > key(y); }) in place."""
    if middle <= 0:
        return
    if middle > 1:                                  # __make_heap
        parent = (middle - 2) // 2
        while True:
            _adjust_heap(a, parent, middle, a[parent], key)
            if parent == 0:
                break
            parent -= 1
    top = key(a[0])
    for i in range(middle, len(a)):                 # __heap_select
        if key(a[i]) > top:
            v, a[i] = a[i], a[0]
            _adjust_heap(a, 0, middle, v, key)
            top = key(a[0])
    for last in range(middle - 1, 0, -1):           # __sort_heap
        v, a[last] = a[last], a[0]
        _adjust_heap(a, 0, last, v, key)


def _gt(key):
    return lambda x, y: key(x) > key(y)


def _insert(a, i: int, gt) -> None:
    """std::__unguarded_linear_insert."""
    v = a[i]
    while gt(v, a[i - 1]):
        a[i] = a[i - 1]
        i -= 1
    a[i] = v


def _insertion_sort(a, lo: int, hi: int, gt) -> None:
    """std::__insertion_sort on a[lo:hi]."""
    for i in range(lo + 1, hi):
        if gt(a[i], a[lo]):
            v = a[i]
            a[lo + 1:i + 1] = a[lo:i]
            a[lo] = v
        else:
            _insert(a, i, gt)


def _introsort_loop(a, lo: int, hi: int, depth: int, gt, key) -> None:
    while hi - lo > 16:                               # _S_threshold
        if depth == 0:                                # std::__partial_sort(first, last, last): heap sort
            part = a[lo:hi]
            partial_sort(part, len(part), key)
            a[lo:hi] = part
            return
        depth -= 1
        mid = lo + (hi - lo) // 2                     # __unguarded_partition_pivot
        x, y, z = lo + 1, mid, hi - 1                 # __move_median_to_first(lo, lo+1, mid, hi-1)
        if gt(a[x], a[y]):
            m = y if gt(a[y], a[z]) else z if gt(a[x], a[z]) else x
        else:
            m = x if gt(a[x], a[z]) else z if gt(a[y], a[z]) else y
        a[lo], a[m] = a[m], a[lo]
        f, l, pivot = lo + 1, hi, a[lo]               # __unguarded_partition(lo+1, hi, lo)
        while True:
            while gt(a[f], pivot):
                f += 1
            l -= 1
            while gt(pivot, a[l]):
                l -= 1
            if not f < l:
                break
            a[f], a[l] = a[l], a[f]
            f += 1
        _introsort_loop(a, f, hi, depth, gt, key)
        hi = f


def std_sort(a: list, key) -> None:
    """std::sort(a.begin(), a.end(), [](x, y) { return key(x) > key(y); }) in place, as libstdc++
    (GCC 12) runs it: introsort (median of three, depth 2*lg n, heap sort past it), then the final
    insertion sort. Equal keys end in its order, not a stable one."""
    n = len(a)
    if n < 2:
        return
    gt = _gt(key)
    _introsort_loop(a, 0, n, 2 * (n.bit_length() - 1), gt, key)
    if n > 16:                                        # __final_insertion_sort
        _insertion_sort(a, 0, 16, gt)
        for i in range(16, n):
            _insert(a, i, gt)
    else:
        _insertion_sort(a, 0, n, gt)
