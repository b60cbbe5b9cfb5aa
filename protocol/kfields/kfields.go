// Package kfields walks the fields of decoded kmsg requests and responses
// by name: how the APIs that carry topic IDs, producer IDs, leader epochs
// and error codes in many shapes are read and rewritten without a
// hand-written walk per message.
package kfields

import "reflect"

// UUID is the type of a topic ID field.
var UUID = reflect.TypeOf([16]byte{})

// Walk calls visit for every exported struct field reachable from v (a
// pointer to a kmsg message, or any value), with the field's name.
func Walk(v any, visit func(name string, f reflect.Value)) { walk(reflect.ValueOf(v), visit) }

func walk(v reflect.Value, visit func(name string, f reflect.Value)) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			walk(v.Elem(), visit)
		}
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < v.NumField(); i++ {
			f := v.Field(i)
			if !t.Field(i).IsExported() {
				continue
			}
			visit(t.Field(i).Name, f)
			switch f.Kind() {
			case reflect.Struct, reflect.Slice, reflect.Pointer:
				walk(f, visit)
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.Struct {
			return
		}
		for i := 0; i < v.Len(); i++ {
			walk(v.Index(i), visit)
		}
	}
}

// ErrorCodes calls f with every ErrorCode field of msg, top-level and
// nested.
func ErrorCodes(msg any, f func(int16)) {
	Walk(msg, func(name string, v reflect.Value) {
		if name == "ErrorCode" && v.Kind() == reflect.Int16 {
			f(int16(v.Int()))
		}
	})
}
