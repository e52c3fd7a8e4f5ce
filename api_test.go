package gowarp_test

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAPIOwnsItsTypes: no exported name of package gowarp — a type
// (alias or not), a field of an exported struct, an exported method, a
// function's parameters and results, a variable's or constant's type —
// mentions a type of an internal package, so the API go doc shows is the
// whole API and nothing internal is reachable through it.
func TestAPIOwnsItsTypes(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the package and its imports from source")
	}
	fset := token.NewFileSet()
	files := parseRoot(t, fset)
	conf := types.Config{Importer: exportImporter(t, fset)}
	pkg, err := conf.Check("github.com/gowarp/gowarp", fset, files, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := apiLeaks(pkg)
	for _, b := range bad {
		t.Error(b)
	}
}

// exportImporter imports the root's dependencies from the export data the
// go command builds (faster than type-checking them from source).
func exportImporter(t *testing.T, fset *token.FileSet) types.Importer {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(l, " "); ok && file != "" {
			exports[path] = file
		}
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
}

func parseRoot(t *testing.T, fset *token.FileSet) []*ast.File {
	t.Helper()
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		// Files for other systems would not type-check together with
		// these; none of them declares API.
		if !buildsHere(f) {
			continue
		}
		files = append(files, f)
	}
	return files
}

func buildsHere(f *ast.File) bool {
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//go:build") && !strings.Contains(c.Text, "linux") && !strings.Contains(c.Text, "unix") {
				return false
			}
		}
	}
	return true
}

// apiLeaks lists each exported name of pkg whose type reaches a type of an
// internal package.
func apiLeaks(pkg *types.Package) []string {
	var bad []string
	check := func(where string, typ types.Type) {
		if p := internalIn(typ, map[types.Type]bool{}); p != "" {
			bad = append(bad, where+" mentions "+p)
		}
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.TypeName:
			if o.IsAlias() {
				// An alias of a public package's type (TermError is
				// package wire's) shows that type's doc; of an internal
				// one, nothing.
				check(name+" (alias)", o.Type())
				continue
			}
			n := o.Type().(*types.Named)
			if s, ok := n.Underlying().(*types.Struct); ok {
				for i := range s.NumFields() {
					if f := s.Field(i); f.Exported() || f.Embedded() {
						check(name+"."+f.Name(), f.Type())
					}
				}
			} else {
				check(name, n.Underlying())
			}
			for i := range n.NumMethods() {
				if m := n.Method(i); m.Exported() {
					check(name+"."+m.Name(), m.Type())
				}
			}
		default:
			check(name, obj.Type())
		}
	}
	return bad
}

// internalIn returns the first internal package path reached from typ
// through what a user of the API sees: exported fields, signatures,
// elements. Named types of this package are followed through their
// exported fields only.
func internalIn(typ types.Type, seen map[types.Type]bool) string {
	if seen[typ] {
		return ""
	}
	seen[typ] = true
	switch t := typ.(type) {
	case *types.Alias:
		return internalIn(types.Unalias(t), seen)
	case *types.Named:
		if p := t.Obj().Pkg(); p != nil && strings.Contains(p.Path(), "/internal/") {
			return t.String()
		}
		if p := t.Obj().Pkg(); p != nil && p.Path() == "github.com/gowarp/gowarp" {
			if s, ok := t.Underlying().(*types.Struct); ok {
				for i := range s.NumFields() {
					if f := s.Field(i); f.Exported() {
						if r := internalIn(f.Type(), seen); r != "" {
							return r
						}
					}
				}
				return ""
			}
			return internalIn(t.Underlying(), seen)
		}
		return ""
	case *types.Pointer:
		return internalIn(t.Elem(), seen)
	case *types.Slice:
		return internalIn(t.Elem(), seen)
	case *types.Array:
		return internalIn(t.Elem(), seen)
	case *types.Map:
		if r := internalIn(t.Key(), seen); r != "" {
			return r
		}
		return internalIn(t.Elem(), seen)
	case *types.Chan:
		return internalIn(t.Elem(), seen)
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for i := range tup.Len() {
				if r := internalIn(tup.At(i).Type(), seen); r != "" {
					return r
				}
			}
		}
	case *types.Struct:
		for i := range t.NumFields() {
			if r := internalIn(t.Field(i).Type(), seen); r != "" {
				return r
			}
		}
	}
	return ""
}
