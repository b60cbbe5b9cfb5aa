package clusterauth

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// notToACluster are the functions outside this package that may build a
// client or open a connection themselves, because what they reach is not
// a cluster: file → function.
var notToACluster = map[string]string{
	// The demo's client creates its topic through Ferry's own listener.
	"cmd/ferry/demo.go": "createTopic",
}

// TestEveryClusterConnectionIsSecured: outside this package, Ferry's code
// builds no franz-go client and opens no connection itself; every client
// to a cluster is built by Security.NewClient and every raw connection
// opened by Security.Dial or Check, so none can go without the cluster's
// TLS and SASL. A switch's end offsets were once listed by a client given
// seed brokers alone: against a SASL standby the listing failed and the
// fences came from the mirror's own count. Test code and the conformance
// tools (clients of Ferry or of the test clusters) are not Ferry's.
func TestEveryClusterConnectionIsSecured(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// Calls that open a connection or configure how one is opened, by
	// import path.
	opening := map[string]map[string]bool{
		"github.com/twmb/franz-go/pkg/kgo": {"NewClient": true, "SeedBrokers": true, "Dialer": true, "SASL": true, "DialTLSConfig": true},
		"net":                              {"Dial": true, "DialTimeout": true, "DialTCP": true},
		"crypto/tls":                       {"Dial": true, "DialWithDialer": true, "Client": true},
	}
	var checked int
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch {
			// conformance and internal/testnet are test support: their
			// sockets reach test brokers and loopback peers.
			case rel == "conformance", rel == "internal/testnet", rel == "protocol/clusterauth", strings.HasPrefix(d.Name(), "."), d.Name() == "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		names := map[string]string{} // local name → import path
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			name := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				name = im.Name.Name
			}
			names[name] = p
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if ok && notToACluster[rel] == fn.Name.Name {
				continue
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && opening[names[x.Name]][sel.Sel.Name] {
					t.Errorf("%s: %s.%s: build clients to a cluster with clusterauth's Security.NewClient, connections with its Dial", rel, x.Name, sel.Sel.Name)
				}
				if sel.Sel.Name == "DialContext" {
					t.Errorf("%s: %s: open connections to a cluster with clusterauth's Security.Dial", rel, sel.Sel.Name)
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d files checked under %s: the walk missed the code", checked, root)
	}
}
