// The protobuf wire format, as much of it as proto/ uses: varints (32-bit as
// number, 64-bit as bigint), doubles, length-delimited strings, bytes and
// messages. Decoding checks every bound, rejects invalid UTF-8 and limits
// nesting, so bytes from the network cannot crash or exhaust the client.

/** A malformed protobuf message. */
export class DecodeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DecodeError";
  }
}

/** The generated encoder/decoder of one message type. */
export interface MessageType<T> {
  readonly typeName: string;
  encode(message: T, writer?: Writer): Writer;
  decode(input: Reader | Uint8Array, length?: number, depth?: number): T;
}

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

export class Writer {
  private buffer = new Uint8Array(64);
  private view = new DataView(this.buffer.buffer);
  private length = 0;

  private reserve(bytes: number): void {
    if (this.length + bytes <= this.buffer.length) return;
    let size = this.buffer.length * 2;
    while (size < this.length + bytes) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.buffer.subarray(0, this.length));
    this.buffer = grown;
    this.view = new DataView(grown.buffer);
  }

  tag(field: number, wireType: number): this {
    return this.uint32(field * 8 + wireType);
  }

  uint32(value: number): this {
    this.reserve(5);
    value >>>= 0;
    while (value > 0x7f) {
      this.buffer[this.length++] = (value & 0x7f) | 0x80;
      value >>>= 7;
    }
    this.buffer[this.length++] = value;
    return this;
  }

  /** Negative values take ten bytes, as in every protobuf runtime. */
  int32(value: number): this {
    return value >= 0 ? this.uint32(value) : this.uint64(BigInt.asUintN(64, BigInt(value | 0)));
  }

  uint64(value: bigint): this {
    let rest = BigInt.asUintN(64, value);
    this.reserve(10);
    while (rest > 0x7fn) {
      this.buffer[this.length++] = Number(rest & 0x7fn) | 0x80;
      rest >>= 7n;
    }
    this.buffer[this.length++] = Number(rest);
    return this;
  }

  int64(value: bigint): this {
    return this.uint64(BigInt.asUintN(64, value));
  }

  bool(value: boolean): this {
    return this.uint32(value ? 1 : 0);
  }

  double(value: number): this {
    this.reserve(8);
    this.view.setFloat64(this.length, value, true);
    this.length += 8;
    return this;
  }

  bytes(value: Uint8Array): this {
    this.uint32(value.length);
    this.reserve(value.length);
    this.buffer.set(value, this.length);
    this.length += value.length;
    return this;
  }

  string(value: string): this {
    return this.bytes(utf8Encoder.encode(value));
  }

  finish(): Uint8Array {
    return this.buffer.slice(0, this.length);
  }
}

export class Reader {
  /** How deep messages may nest before decoding refuses (protobuf's default). */
  static maxDepth = 100;
  position = 0;
  readonly length: number;
  private readonly view: DataView;

  constructor(private readonly buffer: Uint8Array) {
    this.length = buffer.length;
    this.view = new DataView(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  }

  private need(bytes: number): void {
    if (this.position + bytes > this.length) throw new DecodeError("truncated message");
  }

  private byte(): number {
    if (this.position >= this.length) throw new DecodeError("truncated varint");
    return this.buffer[this.position++];
  }

  /** The low 32 bits of a varint (the rest of a 10-byte varint is read and dropped). */
  uint32(): number {
    let result = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      const b = this.byte();
      result |= (b & 0x7f) << shift;
      if (b < 0x80) return result >>> 0;
    }
    for (let i = 0; i < 5; i++) if (this.byte() < 0x80) return result >>> 0;
    throw new DecodeError("varint longer than 10 bytes");
  }

  int32(): number {
    return this.uint32() | 0;
  }

  uint64(): bigint {
    let result = 0n;
    for (let shift = 0n; shift < 70n; shift += 7n) {
      const b = this.byte();
      result |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return BigInt.asUintN(64, result);
    }
    throw new DecodeError("varint longer than 10 bytes");
  }

  int64(): bigint {
    return BigInt.asIntN(64, this.uint64());
  }

  bool(): boolean {
    return this.uint64() !== 0n;
  }

  double(): number {
    this.need(8);
    const value = this.view.getFloat64(this.position, true);
    this.position += 8;
    return value;
  }

  bytes(): Uint8Array {
    const length = this.uint32();
    this.need(length);
    const value = this.buffer.slice(this.position, this.position + length);
    this.position += length;
    return value;
  }

  string(): string {
    const length = this.uint32();
    this.need(length);
    try {
      return utf8Decoder.decode(this.buffer.subarray(this.position, this.position + length));
    } catch {
      throw new DecodeError("a string field is not valid UTF-8");
    } finally {
      this.position += length;
    }
  }

  /** Skips one field of an unknown number (or of an unexpected wire type). */
  skip(wireType: number, depth = 0): void {
    switch (wireType) {
      case 0:
        this.uint64();
        return;
      case 1:
        this.need(8);
        this.position += 8;
        return;
      case 2: {
        const length = this.uint32();
        this.need(length);
        this.position += length;
        return;
      }
      case 3: {
        if (depth >= Reader.maxDepth) throw new DecodeError("groups nested too deep");
        for (;;) {
          const tag = this.uint32();
          if ((tag & 7) === 4) return;
          this.skip(tag & 7, depth + 1);
        }
      }
      case 5:
        this.need(4);
        this.position += 4;
        return;
      default:
        throw new DecodeError(`invalid wire type ${wireType}`);
    }
  }
}
