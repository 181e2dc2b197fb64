#!/usr/bin/env python3
"""Independent oracle for configs with users' own fields: protoc (from
grpcio-tools) compiles the user's .proto files with recorder's protos/, and
Python's protobuf text_format parses and prints with those descriptors.

  custom_config.py compile OUT.pb -I DIR... -- FILE.proto...
      writes a FileDescriptorSet (--include_imports) as protoc does
  custom_config.py encode SET.pb FILE...
      each text config as TraceConfig bytes, length-prefixed (u64 LE)
  custom_config.py print SET.pb < BIN
      the binary TraceConfig on stdin as text
  custom_config.py extensions SET.pb INDEX < BIN
      the extensions set in data_sources[INDEX].config: name, then the
      value's own serialization (hex) per line
  custom_config.py trace SET.pb TRACE
      the same for every data source of the trace's trace_config packet
      (read with Perfetto's own perfetto_trace_pb2), as INDEX NAME HEX
"""
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format


def trace_config_class(set_path):
    fds = descriptor_pb2.FileDescriptorSet()
    with open(set_path, "rb") as f:
        fds.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    desc = pool.FindMessageTypeByName("perfetto.protos.TraceConfig")
    return message_factory.GetMessageClass(desc), pool


def extensions(cfg):
    out = []
    for fd, value in cfg.ListFields():
        if not fd.is_extension:
            continue
        if fd.message_type is not None:
            raw = value.SerializeToString()
        else:
            raw = str(value).encode()
        out.append((fd.full_name, raw.hex()))
    return out


def main():
    cmd = sys.argv[1]
    if cmd == "compile":
        from grpc_tools import protoc
        import grpc_tools

        out = sys.argv[2]
        sep = sys.argv.index("--")
        includes = sys.argv[3:sep]
        files = sys.argv[sep + 1 :]
        well_known = grpc_tools.__path__[0] + "/_proto"
        args = ["protoc", "--include_imports", "--descriptor_set_out=" + out]
        args += includes + ["-I" + well_known] + files
        rc = protoc.main(args)
        sys.exit(rc)
    cls, pool = trace_config_class(sys.argv[2])
    if cmd == "encode":
        for path in sys.argv[3:]:
            m = cls()
            with open(path) as f:
                text_format.Parse(f.read(), m, descriptor_pool=pool)
            b = m.SerializeToString()
            sys.stdout.buffer.write(struct.pack("<Q", len(b)) + b)
    elif cmd == "print":
        m = cls()
        m.ParseFromString(sys.stdin.buffer.read())
        sys.stdout.write(text_format.MessageToString(m, descriptor_pool=pool))
    elif cmd == "extensions":
        m = cls()
        m.ParseFromString(sys.stdin.buffer.read())
        for name, raw in extensions(m.data_sources[int(sys.argv[3])].config):
            print(name, raw)
    elif cmd == "trace":
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        trace = pb.Trace()
        with open(sys.argv[3], "rb") as f:
            trace.ParseFromString(f.read())
        configs = [p.trace_config for p in trace.packet if p.HasField("trace_config")]
        if len(configs) != 1:
            sys.exit("%d trace_config packets" % len(configs))
        # Perfetto's schema keeps the custom fields as unknown bytes; the
        # user's descriptors read them.
        m = cls()
        m.ParseFromString(configs[0].SerializeToString())
        for i, ds in enumerate(m.data_sources):
            for name, raw in extensions(ds.config):
                print(i, name, raw)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
