package io.rmqha.interop;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.util.LinkedHashMap;
import java.util.Map;

/** One JSON object per stdout line, written whole (listener threads print concurrently). */
final class Json {
    private Json() {
    }

    static synchronized void emit(Map<String, Object> event) {
        System.out.println(JSON.toJSONString(event, SerializerFeature.WriteMapNullValue));
        System.out.flush();
    }

    static void emit(String event, Object... keyValues) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("event", event);
        for (int i = 0; i + 1 < keyValues.length; i += 2) {
            out.put((String) keyValues[i], keyValues[i + 1]);
        }
        emit(out);
    }
}
