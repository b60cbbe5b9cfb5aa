package main

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/protocol/clusterauth"
)

// Environment overrides. Every key of the configuration file has a
// variable: FERRY_ and the key's YAML path upper-cased, with "." as "_"
// (listen → FERRY_LISTEN, mirror.sync_interval →
// FERRY_MIRROR_SYNC_INTERVAL). The mapping is derived from the yaml tags
// of Config, so a new key gets its variable without anything written here.
//
// Values: a duration in Go syntax (30s, 1m30s), a boolean true or false, a
// number in decimal, a list comma-separated (FERRY_FLEET_SEEDS=a:7946,b:7946),
// a map as KEY=NUMBER pairs comma-separated.
// An empty variable counts as unset. A list of sections with a name
// (clusters) cannot be created from the environment, but a key of an entry
// the file has can be set: FERRY_CLUSTERS_<NAME>_<KEY>, NAME being the
// entry's name upper-cased with "-" and "." as "_"
// (FERRY_CLUSTERS_PRIMARY_BOOTSTRAP). A variable set for the fleet section
// creates it when the file has none.
//
// The order is: flags over the environment, the environment over the file,
// the file over the defaults.

// envPrefix starts every configuration variable.
const envPrefix = "FERRY"

// envKey is one configuration key and its variable.
type envKey struct {
	Path string // the YAML path, e.g. mirror.sync_interval; clusters.<name>.bootstrap
	Var  string // e.g. FERRY_MIRROR_SYNC_INTERVAL; FERRY_CLUSTERS_<NAME>_BOOTSTRAP
	Type reflect.Type
}

// envKeys lists every configuration key and its variable, in the order of
// the struct.
func envKeys() []envKey {
	var keys []envKey
	var walk func(t reflect.Type, path, env string)
	walk = func(t reflect.Type, path, env string) {
		for i := range t.NumField() {
			f := t.Field(i)
			name := yamlName(f)
			if name == "" {
				continue
			}
			p, e := joinPath(path, name), env+"_"+strings.ToUpper(name)
			ft := f.Type
			switch {
			case ft.Kind() == reflect.Struct && ft != durationType:
				walk(ft, p, e)
			case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
				walk(ft.Elem(), p, e)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				for j := range ft.Elem().NumField() {
					ef := ft.Elem().Field(j)
					if ef.Type.Kind() == reflect.Slice && ef.Type.Elem().Kind() == reflect.Struct {
						continue // a list inside a list entry (clusters[].principals): file only
					}
					if n := yamlName(ef); n != "" && n != "name" {
						for _, l := range leafKeys(ef.Type, n) {
							keys = append(keys, envKey{Path: p + ".<name>." + l.Path, Var: e + "_<NAME>_" + l.Var, Type: l.Type})
						}
					}
				}
			default:
				keys = append(keys, envKey{Path: p, Var: e, Type: ft})
			}
		}
	}
	walk(reflect.TypeOf(Config{}), "", envPrefix)
	return keys
}

var durationType = reflect.TypeOf(time.Duration(0))

// leafKeys are the keys under a key of type t named name: itself, or the
// keys of its section (clusters[].tls.ca_file), Var without a prefix.
func leafKeys(t reflect.Type, name string) []envKey {
	if t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == durationType {
		return []envKey{{Path: name, Var: strings.ToUpper(name), Type: t}}
	}
	var out []envKey
	for i := range t.NumField() {
		if n := yamlName(t.Field(i)); n != "" {
			for _, l := range leafKeys(t.Field(i).Type, n) {
				out = append(out, envKey{Path: name + "." + l.Path, Var: strings.ToUpper(name) + "_" + l.Var, Type: l.Type})
			}
		}
	}
	return out
}

// yamlName is a struct field's key, "" for a field that has none.
func yamlName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// envName is a list entry's name as it appears in a variable.
func envName(name string) string {
	return strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
}

// applyEnv sets the keys whose variable environ (os.Environ's form,
// KEY=VALUE) holds, over the file's values. Every malformed value is
// reported at once, each naming its variable; the error wraps
// ErrInvalidConfig.
func (c *Config) applyEnv(environ []string) error {
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, envPrefix+"_") && v != "" {
			vars[k] = v
		}
	}
	a := envApplier{vars: vars}
	a.structure(reflect.ValueOf(c).Elem(), "", envPrefix)
	if len(a.errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: environment:\n  %w", ErrInvalidConfig, joinLines(a.errs))
}

type envApplier struct {
	vars map[string]string
	errs []error
}

func (a *envApplier) bad(format string, args ...any) {
	a.errs = append(a.errs, fmt.Errorf(format, args...))
}

// structure applies the variables of a section's keys; it reports whether
// any was set.
func (a *envApplier) structure(v reflect.Value, path, env string) bool {
	set := false
	t := v.Type()
	for i := range t.NumField() {
		name := yamlName(t.Field(i))
		if name == "" {
			continue
		}
		if a.field(v.Field(i), joinPath(path, name), env+"_"+strings.ToUpper(name)) {
			set = true
		}
	}
	return set
}

func (a *envApplier) field(v reflect.Value, path, env string) bool {
	t := v.Type()
	switch {
	case t.Kind() == reflect.Struct && t != durationType:
		return a.structure(v, path, env)
	case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct:
		if !v.IsNil() {
			return a.structure(v.Elem(), path, env)
		}
		s := reflect.New(t.Elem())
		if !a.structure(s.Elem(), path, env) {
			return false
		}
		v.Set(s)
		return true
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return a.named(v, path, env)
	}
	s, ok := a.vars[env]
	if !ok {
		return false
	}
	if err := setValue(v, s); err != nil {
		a.bad("%s=%q (%s): %v", env, s, path, err)
		return false
	}
	return true
}

// named applies FERRY_<LIST>_<NAME>_<KEY> to the entries of a list of
// sections that have a name. A variable under the list's prefix that names
// no entry (or no key) is an error: it was meant for something.
func (a *envApplier) named(v reflect.Value, path, env string) bool {
	prefix := env + "_"
	byName := map[string][]int{}
	for i := range v.Len() {
		if n := entryName(v.Index(i)); n != "" {
			byName[envName(n)] = append(byName[envName(n)], i)
		}
	}
	used := map[string]bool{}
	set := false
	for n, idx := range byName {
		if len(idx) > 1 {
			continue
		}
		e := v.Index(idx[0])
		t := e.Type()
		for j := range t.NumField() {
			key := yamlName(t.Field(j))
			if key == "" || key == "name" {
				continue
			}
			ev := prefix + n + "_" + strings.ToUpper(key)
			for _, l := range leafKeys(t.Field(j).Type, key) {
				used[prefix+n+"_"+l.Var] = true
			}
			if a.field(e.Field(j), fmt.Sprintf("%s[%d].%s", path, idx[0], key), ev) {
				set = true
			}
		}
	}
	var unknown []string
	for k := range a.vars {
		if strings.HasPrefix(k, prefix) && !used[k] {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		if i := strings.LastIndex(k, "_SASL_"); i > 0 {
			if use, ok := clusterauth.SecretKeys[strings.ToLower(k[i+len("_SASL_"):])]; ok {
				a.bad("%s: a secret is not a configuration key: put it in a file or another environment variable and name it with sasl.%s", k, use)
				continue
			}
		}
		names := make([]string, 0, v.Len())
		for i := range v.Len() {
			names = append(names, entryName(v.Index(i)))
		}
		a.bad("%s: names no key of an entry of %s in the file (%s_<NAME>_<KEY> sets a key of an entry the file has; its names: %s)",
			k, path, env, strings.Join(names, ", "))
	}
	return set
}

// entryName is the name key of a list entry, "" without one.
func entryName(v reflect.Value) string {
	t := v.Type()
	for i := range t.NumField() {
		if yamlName(t.Field(i)) == "name" && v.Field(i).Kind() == reflect.String {
			return v.Field(i).String()
		}
	}
	return ""
}

// setValue parses s into v, a leaf key: a string, number, boolean,
// duration or list of strings, or a pointer to one.
func setValue(v reflect.Value, s string) error {
	t := v.Type()
	if t.Kind() == reflect.Pointer {
		p := reflect.New(t.Elem())
		if err := setValue(p.Elem(), s); err != nil {
			return err
		}
		v.Set(p)
		return nil
	}
	switch {
	case t == durationType:
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("not a duration (Go syntax, e.g. 30s, 1m30s, 500ms)")
		}
		v.SetInt(int64(d))
	case t.Kind() == reflect.String:
		v.SetString(s)
	case t.Kind() == reflect.Bool:
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "true":
			v.SetBool(true)
		case "false":
			v.SetBool(false)
		default:
			return fmt.Errorf("not a boolean: want true or false")
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, t.Bits())
		if err != nil {
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
				return fmt.Errorf("out of range for this key")
			}
			return fmt.Errorf("not a whole number")
		}
		v.SetInt(n)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		var items []string
		for _, it := range strings.Split(s, ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		v.Set(reflect.ValueOf(items).Convert(t))
	case t.Kind() == reflect.Map && t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.Int:
		m := reflect.MakeMap(t)
		for _, it := range strings.Split(s, ",") {
			if it = strings.TrimSpace(it); it == "" {
				continue
			}
			k, n, ok := strings.Cut(it, "=")
			v, err := strconv.Atoi(strings.TrimSpace(n))
			if !ok || err != nil {
				return fmt.Errorf("want KEY=NUMBER pairs, comma-separated (10.0.0.5=1000,10.0.0.6=0)")
			}
			m.SetMapIndex(reflect.ValueOf(strings.TrimSpace(k)), reflect.ValueOf(v))
		}
		v.Set(m)
	default:
		// A key of a new kind: envKeys' test catches it before a user does.
		return fmt.Errorf("a %s key cannot be set from the environment", t)
	}
	return nil
}

// configDiff lists the keys whose values differ between a and b, by YAML
// path; a list of named sections whose names differ is one key (its
// path), and otherwise each entry's keys (clusters[0].bootstrap). A
// changed admin token (from FERRY_ADMIN_TOKEN or the file
// admin_token_file names) is reported as "admin token", without its value.
func configDiff(a, b *Config) []string {
	var out []string
	var walk func(x, y reflect.Value, path string)
	walk = func(x, y reflect.Value, path string) {
		t := x.Type()
		switch {
		case t.Kind() == reflect.Struct && t != durationType:
			for i := range t.NumField() {
				if name := yamlName(t.Field(i)); name != "" {
					walk(x.Field(i), y.Field(i), joinPath(path, name))
				}
			}
			return
		case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct && !x.IsNil() && !y.IsNil():
			walk(x.Elem(), y.Elem(), path)
			return
		case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct && x.Len() == y.Len():
			same := true
			for i := range x.Len() {
				same = same && entryName(x.Index(i)) == entryName(y.Index(i))
			}
			if same {
				for i := range x.Len() {
					walk(x.Index(i), y.Index(i), fmt.Sprintf("%s[%d]", path, i))
				}
				return
			}
		}
		if !reflect.DeepEqual(x.Interface(), y.Interface()) {
			out = append(out, path)
		}
	}
	walk(reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem(), "")
	if a.adminToken != b.adminToken {
		out = append(out, "admin token")
	}
	return out
}
