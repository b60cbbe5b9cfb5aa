package proxy

import "reflect"

// uuidType is the type of a topic ID field.
var uuidType = reflect.TypeFor[[16]byte]()

// walkFields calls visit for every exported struct field reachable from v
// (a pointer to a kmsg message), with the field's name: the tests' own
// reflection walk, independent of the generated one they check.
func walkFields(v any, visit func(name string, f reflect.Value)) {
	walkValue(reflect.ValueOf(v), visit)
}

func walkValue(v reflect.Value, visit func(name string, f reflect.Value)) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			walkValue(v.Elem(), visit)
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
				walkValue(f, visit)
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.Struct {
			return
		}
		for i := 0; i < v.Len(); i++ {
			walkValue(v.Index(i), visit)
		}
	}
}
