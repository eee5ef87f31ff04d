// Package nilness tells a usable value from a nil one hidden in an
// interface.
package nilness

import "reflect"

// Is reports whether v is nil, or an interface holding a nil pointer, map,
// slice, func or channel: what an ignored constructor error leaves behind
// (guard, _ := lock.NewAdvisory(...)). Such a value passes a plain
// v == nil check and panics at first use.
func Is(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
