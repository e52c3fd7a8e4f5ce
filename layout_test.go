package gowarp

import (
	"reflect"
	"testing"

	"github.com/gowarp/gowarp/internal/engine"
	"github.com/gowarp/gowarp/internal/mem"
)

// The public types that wr.go, mr.go and qp.go hand to the engine by
// pointer conversion, each with the engine's type it stands for.
var twins = map[reflect.Type]reflect.Type{
	reflect.TypeFor[SendWR]():       reflect.TypeFor[engine.SendWR](),
	reflect.TypeFor[RecvWR]():       reflect.TypeFor[engine.RecvWR](),
	reflect.TypeFor[SGE]():          reflect.TypeFor[engine.SGE](),
	reflect.TypeFor[Completion]():   reflect.TypeFor[engine.Completion](),
	reflect.TypeFor[MR]():           reflect.TypeFor[mem.Region](),
	reflect.TypeFor[QP]():           reflect.TypeFor[engine.QP](),
	reflect.TypeFor[CQ]():           reflect.TypeFor[engine.CQ](),
	reflect.TypeFor[Prepared]():     reflect.TypeFor[engine.Prepared](),
	reflect.TypeFor[WROp]():         reflect.TypeFor[engine.WROp](),
	reflect.TypeFor[WRFlags]():      reflect.TypeFor[engine.WRFlags](),
	reflect.TypeFor[CompletionOp](): reflect.TypeFor[engine.CompletionOp](),
	reflect.TypeFor[Status]():       reflect.TypeFor[engine.Status](),
}

// TestLayoutsMatchEngine: every type converted by pointer to the engine's
// has the engine type's layout, field by field, recursively: same names,
// offsets, sizes and kinds, and pointers and slices to twins again. A
// field added to one side and not the other fails here, not in memory.
func TestLayoutsMatchEngine(t *testing.T) {
	for pub, eng := range twins {
		t.Run(pub.Name(), func(t *testing.T) { sameLayout(t, pub.Name(), pub, eng) })
	}
}

func sameLayout(t *testing.T, path string, pub, eng reflect.Type) {
	t.Helper()
	if pub.Size() != eng.Size() || pub.Align() != eng.Align() {
		t.Fatalf("%s: size/align %d/%d, engine's %s %d/%d", path, pub.Size(), pub.Align(), eng, eng.Size(), eng.Align())
	}
	// A handle's only field is the engine object itself, by value.
	if pub.Kind() == reflect.Struct && pub.NumField() == 1 && pub.Field(0).Type == eng {
		if pub.Field(0).Offset != 0 {
			t.Fatalf("%s: handle field at offset %d", path, pub.Field(0).Offset)
		}
		return
	}
	if pub.Kind() != eng.Kind() {
		t.Fatalf("%s: kind %s, engine's %s", path, pub.Kind(), eng.Kind())
	}
	switch pub.Kind() {
	case reflect.Struct:
		if pub.NumField() != eng.NumField() {
			t.Fatalf("%s: %d fields, engine's %s has %d", path, pub.NumField(), eng, eng.NumField())
		}
		for i := range pub.NumField() {
			pf, ef := pub.Field(i), eng.Field(i)
			p := path + "." + pf.Name
			if pf.Name != ef.Name || pf.Offset != ef.Offset {
				t.Fatalf("%s: at offset %d, engine's field %d is %s at %d", p, pf.Offset, i, ef.Name, ef.Offset)
			}
			sameLayout(t, p, pf.Type, ef.Type)
		}
	case reflect.Pointer, reflect.Slice:
		pe, ee := pub.Elem(), eng.Elem()
		if twins[pe] != ee && pe != ee {
			t.Fatalf("%s: element %s is not the twin of the engine's %s", path, pe, ee)
		}
		if pe != ee && pub.Kind() == reflect.Slice {
			sameLayout(t, path+"[]", pe, ee)
		}
	case reflect.Array, reflect.Map, reflect.Chan, reflect.Func, reflect.Interface:
		if pub != eng {
			t.Fatalf("%s: %s, engine's %s", path, pub, eng)
		}
	default: // numbers, bool, string: kind and size checked above
	}
}

// TestEnumValuesMatchEngine: the root's constants, spelled out so that
// go doc shows them as values, are the engine's and the registry's.
func TestEnumValuesMatchEngine(t *testing.T) {
	for _, c := range []struct {
		name     string
		pub, eng int64
	}{
		{"MaxSGE", MaxSGE, engine.MaxSGE},
		{"NoReads", NoReads, engine.NoReads},
		{"OpSend", int64(OpSend), int64(engine.OpSend)},
		{"OpSendInv", int64(OpSendInv), int64(engine.OpSendInv)},
		{"OpWrite", int64(OpWrite), int64(engine.OpWrite)},
		{"OpRead", int64(OpRead), int64(engine.OpRead)},
		{"Signaled", int64(Signaled), int64(engine.Signaled)},
		{"Solicited", int64(Solicited), int64(engine.Solicited)},
		{"Fence", int64(Fence), int64(engine.Fence)},
		{"CompSend", int64(CompSend), int64(engine.CompSend)},
		{"CompWrite", int64(CompWrite), int64(engine.CompWrite)},
		{"CompRead", int64(CompRead), int64(engine.CompRead)},
		{"CompRecv", int64(CompRecv), int64(engine.CompRecv)},
		{"Success", int64(Success), int64(engine.Success)},
		{"LocalLengthError", int64(LocalLengthError), int64(engine.LocalLengthError)},
		{"LocalQPError", int64(LocalQPError), int64(engine.LocalQPError)},
		{"LocalProtectionError", int64(LocalProtectionError), int64(engine.LocalProtectionError)},
		{"WRFlushError", int64(WRFlushError), int64(engine.WRFlushError)},
		{"RemoteAccessError", int64(RemoteAccessError), int64(engine.RemoteAccessError)},
		{"RemoteOperationError", int64(RemoteOperationError), int64(engine.RemoteOperationError)},
		{"RemoteInvalidRequest", int64(RemoteInvalidRequest), int64(engine.RemoteInvalidRequest)},
		{"FatalError", int64(FatalError), int64(engine.FatalError)},
		{"StateIdle", int64(StateIdle), int64(engine.StateIdle)},
		{"StateConnecting", int64(StateConnecting), int64(engine.StateConnecting)},
		{"StateReady", int64(StateReady), int64(engine.StateReady)},
		{"StateClosing", int64(StateClosing), int64(engine.StateClosing)},
		{"StateError", int64(StateError), int64(engine.StateError)},
		{"Handed", int64(Handed), int64(engine.Handed)},
		{"Acked", int64(Acked), int64(engine.Acked)},
		{"LocalWrite", int64(LocalWrite), int64(mem.LocalWrite)},
		{"RemoteRead", int64(RemoteRead), int64(mem.RemoteRead)},
		{"RemoteWrite", int64(RemoteWrite), int64(mem.RemoteWrite)},
		{"RemoteInvalidate", int64(RemoteInvalidate), int64(mem.RemoteInvalidate)},
		{"EventQPFatal", int64(EventQPFatal), int64(engine.EventQPFatal)},
		{"EventPeerTerminated", int64(EventPeerTerminated), int64(engine.EventPeerTerminated)},
		{"EventPeerClosed", int64(EventPeerClosed), int64(engine.EventPeerClosed)},
		{"EventCQOverrun", int64(EventCQOverrun), int64(engine.EventCQOverrun)},
		{"EventLastWQE", int64(EventLastWQE), int64(engine.EventLastWQE)},
	} {
		if c.pub != c.eng {
			t.Errorf("%s = %d, engine's %d", c.name, c.pub, c.eng)
		}
	}
	// The types converted by value (State, CompletionMode, Access,
	// EventType) have the engine's size, so no value is cut.
	for _, p := range [][2]reflect.Type{
		{reflect.TypeFor[State](), reflect.TypeFor[engine.State]()},
		{reflect.TypeFor[CompletionMode](), reflect.TypeFor[engine.CompletionMode]()},
		{reflect.TypeFor[Access](), reflect.TypeFor[mem.Access]()},
		{reflect.TypeFor[EventType](), reflect.TypeFor[engine.EventType]()},
		{reflect.TypeFor[STag](), reflect.TypeFor[mem.STag]()},
	} {
		if p[0].Kind() != p[1].Kind() {
			t.Errorf("%s is %s, engine's %s", p[0], p[0].Kind(), p[1].Kind())
		}
	}
}
